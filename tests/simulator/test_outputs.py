"""Results folders (simulator/report/outputs.py): one writer at a time, whole-folder swaps, no stale
files, kept caches, recovery after a killed run, and one-line errors for a bad ``--out``.

The concurrency tests use real processes: a lock between threads of one process proves nothing
about two ``kvplan`` runs started from two shells.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from simulator.report import files as report
from simulator.commands.capacity import cmd as capacity_cmd
from simulator.cli import main
from simulator.errors import KvplanError, KvplanWarning
from simulator.report.outputs import MARKER, default_out_dir, open_output

ROOT = Path(__file__).resolve().parents[2]
SIMULATE_FILES = {"summary.json", "run.json", "requests.csv", "steps.csv", "report.html", MARKER}
PLOTS = {"kv_memory.png", "batch_size.png", "latency_cdf.png", "allocators.png"}

SMALL = """\
name: small
seed: 3
model: llama-3.1-8b
gpu: h100-80gb
allocators: [paged]
max_model_len: 1024
num_gpu_blocks_override: 64
workload:
  num_requests: 20
  arrival: {process: poisson, rate: 40}
  prompt_tokens: {dist: lognormal, mean: 150, p99: 600, max: 800}
  output_tokens: {dist: fixed, value: 8}
"""

# A capacity sweep point that searches in well under a second.
CAPACITY = {
    "name": "tiny", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 2, "allocators": ["paged"],
    "latency": {"model": "constant", "step_s": 0.02},
    "workload": {"arrival": {"process": "poisson", "rate": 5.0}, "num_requests": 30,
                 "prompt_tokens": {"dist": "fixed", "value": 32}, "output_tokens": {"dist": "fixed", "value": 4}},
    "slo": {"ttft_p99_s": 0.3, "tpot_p99_s": 0.1},
}


# Holds an output folder open (one file staged) until a line arrives on stdin.
HOLDER = """\
import sys
from simulator.report.outputs import open_output
with open_output(sys.argv[1], command="holder", keep=("cache",)) as folder:
    folder.kept("cache").mkdir(exist_ok=True)
    (folder.kept("cache") / "probe.json").write_text("from the holder")
    (folder.staging / "holder.txt").write_text("staged")
    print("ready", flush=True)
    sys.stdin.readline()
"""

# Writes 20 files into the folder, each holding the writer's name; exit 2 when refused.
WRITER = """\
import sys, time
from simulator.errors import KvplanError
from simulator.report.outputs import open_output
try:
    with open_output(sys.argv[1], command="writer") as folder:
        for i in range(20):
            (folder.staging / f"part{i:02d}.txt").write_text(sys.argv[2])
            time.sleep(0.002)
except KvplanError as err:
    print(err, file=sys.stderr)
    sys.exit(2)
"""


def python(script: str, *args: str, **kwargs: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=ROOT, text=True, **kwargs)


def simulate(capsys: pytest.CaptureFixture[str], *args: object) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["simulate", *map(str, args)])
    return rc, capsys.readouterr().err


def names(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir()}


def write(folder: Path, files: dict[str, str], *, keep: tuple[str, ...] = ()) -> Path:
    with open_output(folder, command="test", keep=keep) as out:
        for name, text in files.items():
            (out.staging / name).write_text(text)
    return folder


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    path = tmp_path / "small.yaml"
    path.write_text(SMALL)
    return path


# --- swap, stale files, kept entries ------------------------------------------------------------


def test_a_rerun_replaces_the_folder_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    out = write(tmp_path / "out", {"a.csv": "1", "old.png": "png"})
    write(out, {"a.csv": "2"})
    assert names(out) == {"a.csv", MARKER}  # no stale plot of the first run
    assert (out / "a.csv").read_text() == "2"
    assert json.loads((out / MARKER).read_text()) == {"command": "test", "written_by": "kvplan"}
    assert names(tmp_path) == {"out"}  # no lock, staging or old folder left


def test_results_get_the_usual_permissions(tmp_path: Path) -> None:
    out = write(tmp_path / "out", {"a.csv": "1"})
    umask = os.umask(0)
    os.umask(umask)
    assert out.stat().st_mode & 0o777 == 0o777 & ~umask  # not mkdtemp's 0700


def test_an_error_while_writing_keeps_the_previous_results(tmp_path: Path) -> None:
    out = write(tmp_path / "out", {"a.csv": "1"})
    with pytest.raises(KvplanError, match="boom"), open_output(out, command="test") as folder:
        (folder.staging / "a.csv").write_text("half")
        raise KvplanError("boom")
    assert (out / "a.csv").read_text() == "1"
    assert names(tmp_path) == {"out"}


def test_a_kept_entry_survives_the_swap(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with open_output(out, command="test", keep=("cache",)) as folder:
        assert folder.kept("cache") == out / "cache" and out.is_dir()  # lives in place during the run
        folder.kept("cache").mkdir()
        (folder.kept("cache") / "p1.json").write_text("1")
        (folder.staging / "table.csv").write_text("first")
    with open_output(out, command="test", keep=("cache",)) as folder:
        (folder.kept("cache") / "p2.json").write_text("2")
        (folder.staging / "other.csv").write_text("second")
    assert names(out) == {"cache", "other.csv", MARKER}
    assert names(out / "cache") == {"p1.json", "p2.json"}


def test_published_maps_a_staged_file_to_its_final_place(tmp_path: Path) -> None:
    with open_output(tmp_path / "out", command="test") as folder:
        staged = folder.staging / "profile.yaml"
        assert folder.published(staged) == tmp_path / "out" / "profile.yaml"
        assert folder.published(Path("elsewhere.yaml")) == Path("elsewhere.yaml")


def test_json_and_csv_writers_never_share_a_temporary_name(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    errors: list[BaseException] = []

    def hammer(value: int) -> None:
        try:
            for _ in range(100):
                report.write_json(path, {"writer": value, "pad": "x" * 2000})
        except BaseException as err:  # noqa: BLE001 — collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert json.loads(path.read_text())["writer"] in (0, 1, 2)  # one whole file, never a mix
    assert names(tmp_path) == {"summary.json"}


# --- one writer at a time (real processes) ------------------------------------------------------


def test_a_second_run_is_refused_while_the_first_holds_the_folder(tmp_path: Path, scenario: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    holder = python(HOLDER, str(out), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        rc, err = simulate(capsys, scenario, "--out", out, "--quiet", "--no-plots")
        assert rc == 2 and err.count("\n") == 1
        assert f"pid {holder.pid}" in err and "is writing this folder" in err
        assert names(out) == {"cache", MARKER}  # the holder's results are not in yet, nothing of ours
    finally:
        holder.communicate("go\n", timeout=60)
    assert holder.returncode == 0
    assert names(out) == {"cache", "holder.txt", MARKER}
    rc, err = simulate(capsys, scenario, "--out", out, "--quiet", "--no-plots")
    assert rc == 0, err
    assert names(out) == SIMULATE_FILES  # the holder's files are gone, not mixed with ours


def test_concurrent_writers_never_mix_their_files(tmp_path: Path) -> None:
    out = tmp_path / "out"
    procs = {name: python(WRITER, str(out), name, stderr=subprocess.PIPE) for name in "abcd"}
    done = {name: (p.wait(timeout=60), p.stderr.read() if p.stderr else "") for name, p in procs.items()}
    for p in procs.values():
        if p.stderr:
            p.stderr.close()
    winners = [name for name, (rc, _) in done.items() if rc == 0]
    assert winners, done
    for name, (rc, err) in done.items():
        assert rc in (0, 2), err
        if rc == 2:
            assert "is writing this folder" in err and err.count("\n") == 1
    texts = {(out / f"part{i:02d}.txt").read_text() for i in range(20)}
    assert len(texts) == 1 and texts <= set(winners)  # every file from one and the same run
    assert names(out) == {f"part{i:02d}.txt" for i in range(20)} | {MARKER}
    assert names(tmp_path) == {"out"}


def test_a_killed_writer_leaves_nothing_that_blocks_or_leaks(tmp_path: Path) -> None:
    out = write(tmp_path / "out", {"result.csv": "previous"}, keep=("cache",))
    holder = python(HOLDER, str(out), stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=60)
    assert holder.stdin is not None and holder.stdout is not None
    holder.stdin.close()
    holder.stdout.close()
    assert (tmp_path / ".out.lock").read_text().strip() == str(holder.pid)  # its pid is dead
    assert any(n.startswith(".out.kvplan-new-") for n in names(tmp_path))
    assert (out / "result.csv").read_text() == "previous"  # a killed run changes no result
    write(out, {"result.csv": "next"}, keep=("cache",))  # the stale lock is taken over
    assert names(out) == {"cache", "result.csv", MARKER}
    assert (out / "cache" / "probe.json").read_text() == "from the holder"  # probes already paid for
    assert names(tmp_path) == {"out"}


def test_a_run_killed_between_the_swap_renames_is_recovered(tmp_path: Path) -> None:
    out = tmp_path / "out"
    aside = tmp_path / ".out.kvplan-old-0123abcd"  # the previous results, renamed aside
    (aside / "cache").mkdir(parents=True)
    (aside / "cache" / "p.json").write_text("probe")
    (aside / "table.csv").write_text("previous")
    (aside / MARKER).write_text("{}")
    staged = tmp_path / ".out.kvplan-new-89abcdef"  # the dead run's results, never swapped in
    staged.mkdir()
    (staged / "table.csv").write_text("dead run")
    with open_output(out, command="test", keep=("cache",)) as folder:
        assert (out / "table.csv").read_text() == "previous"  # put back before this run starts
        (folder.staging / "table.csv").write_text("this run")
    assert (out / "table.csv").read_text() == "this run"
    assert (out / "cache" / "p.json").read_text() == "probe"
    assert names(tmp_path) == {"out"}


def test_kept_entries_left_aside_move_into_the_new_folder(tmp_path: Path) -> None:
    out = write(tmp_path / "out", {"table.csv": "new"})  # killed after the second rename
    aside = tmp_path / ".out.kvplan-old-0123abcd"
    (aside / "cache").mkdir(parents=True)
    (aside / "cache" / "p.json").write_text("probe")
    with open_output(out, command="test", keep=("cache",)) as folder:
        assert (folder.kept("cache") / "p.json").read_text() == "probe"
        (folder.staging / "table.csv").write_text("again")
    assert names(out) == {"cache", "table.csv", MARKER}


# --- a bad --out: one line, exit 2, nothing destroyed -------------------------------------------


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A folder this process cannot create anything in."""
    if os.geteuid() != 0:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o555)
        yield folder
        folder.chmod(0o755)
        return
    try:  # root writes anywhere a mode allows it: use a filesystem that refuses new folders
        os.mkdir("/sys/kvplan-probe")
    except OSError:
        yield Path("/sys")
        return
    os.rmdir("/sys/kvplan-probe")
    pytest.skip("no folder here refuses root")


@pytest.mark.parametrize(("where", "message"), [
    ("file", "exists and is not a folder"),
    ("under-file", "is a file, not a folder"),
    ("foreign", "holds files kvplan did not write (notes.txt)"),
    ("unwritable", "cannot"),
    ("cwd", "is the working folder or holds it"),
    ("cwd-parent", "is the working folder or holds it"),
])
def test_bad_out_is_a_one_line_error(where: str, message: str, tmp_path: Path, scenario: Path,
                                     unwritable: Path, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file.txt").write_text("keep me")
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep me")
    (tmp_path / "work" / "sub").mkdir(parents=True)
    out = {"file": tmp_path / "file.txt", "under-file": tmp_path / "file.txt" / "x",
           "foreign": tmp_path / "mine", "unwritable": unwritable / "out",
           "cwd": Path("."), "cwd-parent": Path("..")}[where]
    monkeypatch.chdir(tmp_path / "work" / "sub")
    rc, err = simulate(capsys, scenario, "--out", out, "--quiet", "--no-plots")
    assert rc == 2 and err.count("\n") == 1 and err.startswith(f"kvplan: error: {out}: "), err
    assert message in err
    assert (tmp_path / "file.txt").read_text() == "keep me"
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep me"
    assert names(tmp_path / "work") == {"sub"} and not list((tmp_path / "work" / "sub").iterdir())


@pytest.mark.parametrize("command", ["validate", "capacity"])
def test_other_commands_check_out_the_same_way(command: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "file.txt").write_text("keep me")
    out = tmp_path / "file.txt" / "x"
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump(CAPACITY))
    argv = {"validate": ["validate", "--source", "vllm-ci", "-q"],
            "capacity": ["capacity", str(scenario), "--jobs", "1", "-q", "--no-plots"]}[command]
    assert main([*argv, "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err == f"kvplan: error: {out}: {tmp_path / 'file.txt'} is a file, not a folder\n"


def test_capacity_default_folder_stays_under_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    scenario = tmp_path / "tiny.yaml"
    scenario.write_text(yaml.safe_dump({**CAPACITY, "name": "../escape"}))
    (tmp_path / "work").mkdir()
    monkeypatch.chdir(tmp_path / "work")
    assert main(["capacity", str(scenario), "--jobs", "1", "-q", "--no-plots"]) == 2
    assert "name '../escape' cannot name a folder in runs/" in capsys.readouterr().err
    assert names(tmp_path) == {"tiny.yaml", "work"} and names(tmp_path / "work") == set()


def test_a_folder_written_before_the_marker_existed_is_replaced(tmp_path: Path, scenario: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    out.mkdir()
    for name in ("summary.json", "steps.csv", "kv_memory.png"):
        (out / name).write_text("old")
    rc, err = simulate(capsys, scenario, "--out", out, "--quiet", "--no-plots")
    assert rc == 0, err
    assert names(out) == SIMULATE_FILES


# --- the default folder: runs/<name>/ -----------------------------------------------------------


@pytest.mark.parametrize("name", ["../escape", "..", "sub/dir", "{abs}/escape", "."])
def test_a_scenario_name_cannot_write_outside_runs(name: str, tmp_path: Path, scenario: Path,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    scenario.write_text(SMALL.replace("name: small", f"name: '{name.format(abs=tmp_path)}'"))
    rc, err = simulate(capsys, scenario, "--quiet", "--no-plots")
    assert rc == 2 and err.count("\n") == 1 and "cannot name a folder in runs/" in err, err
    assert names(tmp_path) == {"work", "small.yaml"} and names(work) == set()


def test_default_out_dir_suffixes_a_plain_name() -> None:
    assert default_out_dir("chat", suffix="-capacity", where="x.yaml") == Path("runs/chat-capacity")
    assert default_out_dir("v1..2", where="x.yaml") == Path("runs/v1..2")  # '..' inside a name is no path
    with pytest.raises(KvplanError, match=r"^x.yaml: name '/etc' cannot name a folder in runs/"):
        default_out_dir("/etc", suffix="-capacity", where="x.yaml")


def test_simulate_rerun_into_the_default_folder_drops_stale_plots(tmp_path: Path, scenario: Path,
                                                                  monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert simulate(capsys, scenario, "--quiet")[0] == 0
    assert names(tmp_path / "runs" / "small") == SIMULATE_FILES | PLOTS
    assert simulate(capsys, scenario, "--quiet", "--no-plots")[0] == 0
    assert names(tmp_path / "runs" / "small") == SIMULATE_FILES
    assert names(tmp_path / "runs") == {"small"}


# --- capacity: results replaced, probe cache kept -----------------------------------------------


def capacity(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="kvplan")
    capacity_cmd.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["capacity", *argv])
    return int(args.func(args))


def test_capacity_rerun_replaces_points_and_keeps_the_cache(tmp_path: Path) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(CAPACITY))
    out = tmp_path / "out"
    argv = (str(path), "--seeds", "1", "--jobs", "1", "--out", str(out), "--quiet", "--tolerance", "0.2")
    assert capacity(*argv, "--sweep", "block_size=16,32") == 0
    assert names(out / "plots" / "points") == {"000.png", "001.png"}
    probes = names(out / "cache")
    assert probes
    with pytest.warns(KvplanWarning, match="made with other settings"):  # another sweep of the file
        assert capacity(*argv, "--sweep", "block_size=16") == 0
    assert names(out / "plots" / "points") == {"000.png"}  # point 001 is not this run's
    assert names(out / "cache") == probes  # the one point's probes all came from the cache
    assert {"capacity.csv", "capacity.json", "report.html", "cache", "plots", MARKER} == names(out)
    assert names(tmp_path) == {"tiny.yaml", "out"}

