"""Ordinary sequences of commands lose nothing (simulator/report/outputs.py, "Whose run a folder holds").

* a re-run of ``simulate`` keeps what ``export`` and ``compare`` wrote, by default (beside the run
  folder) and when they were pointed inside it (``--out runs/chat/export``);
* a run of another scenario file is refused over a folder that holds a run, naming both, unless
  ``--replace``; a re-run of the same file with other settings replaces it with a one-line warning;
* a failure to write the results (a full disk) is one line, exit 2, and the previous results stay.
"""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from simulator.cli import main
from simulator.report.outputs import MARKER

ROOT = Path(__file__).resolve().parents[2]
RESULT = ROOT / "tests" / "data" / "compare" / "vllm-bench.json"

SCENARIO = """\
name: {name}
seed: 1
model: llama-3.1-8b
gpu: h100
allocators: [paged]
max_model_len: 2048
latency: {{model: constant, step_s: 0.01}}
workload:
  num_requests: 12
  arrival: {{process: poisson, rate: 20}}
  prompt_tokens: {{dist: fixed, value: 64}}
  output_tokens: {{dist: fixed, value: 8}}
"""


@pytest.fixture()
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working folder of its own: the commands' default folders land in its runs/."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s").mkdir()
    (tmp_path / "s" / "chat.yaml").write_text(SCENARIO.format(name="chat"))
    (tmp_path / "s" / "other.yaml").write_text(SCENARIO.format(name="chat").replace("value: 8", "value: 6"))
    return tmp_path


def run(*argv: str) -> int:
    return main([*argv, "--quiet"] if argv[0] != "export" else list(argv))


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (the marker apart: it names the command line that wrote it)."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != MARKER}


def test_simulate_export_simulate_keeps_the_export(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("simulate", "s/chat.yaml", "--no-plots") == 0
    assert run("export", "runs/chat") == 0
    exported = snapshot(here / "runs" / "chat-export")
    assert {"serve.sh", "bench.sh", "trace.jsonl"} <= set(exported)
    assert run("simulate", "s/chat.yaml", "--no-plots") == 0
    assert snapshot(here / "runs" / "chat-export") == exported
    # the scenario and the run folder are the same input: re-exporting either replaces the folder
    assert run("export", "s/chat.yaml") == 0
    assert snapshot(here / "runs" / "chat-export") == exported
    assert "holds a run" not in capsys.readouterr().err


def test_export_then_simulate(here: Path) -> None:
    assert run("export", "s/chat.yaml") == 0
    assert run("simulate", "s/chat.yaml", "--no-plots") == 0
    assert (here / "runs" / "chat-export" / "serve.sh").is_file()
    assert (here / "runs" / "chat" / "summary.json").is_file()


def test_a_kvplan_folder_written_inside_a_run_survives_its_re_run(here: Path) -> None:
    """The old default (``runs/chat/export``), or any ``--out`` a user points inside a run."""
    assert run("export", "s/chat.yaml", "--out", "runs/chat/export") == 0  # before any run: only it
    assert run("simulate", "s/chat.yaml", "--no-plots") == 0
    inside = snapshot(here / "runs" / "chat" / "export")
    assert "serve.sh" in inside
    assert run("simulate", "s/chat.yaml", "--no-plots", "--set", "block_size=32") == 0
    assert snapshot(here / "runs" / "chat" / "export") == inside
    assert (here / "runs" / "chat" / "summary.json").is_file()


def test_simulate_compare_simulate(here: Path) -> None:
    assert run("simulate", "s/chat.yaml", "--no-plots") == 0
    assert run("compare", str(RESULT), "--against", "runs/chat", "--no-plots") == 0
    compared = snapshot(here / "runs" / "chat-compare")
    assert run("simulate", "s/chat.yaml", "--no-plots") == 0
    assert snapshot(here / "runs" / "chat-compare") == compared


def test_another_scenario_with_the_same_name_is_refused(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("simulate", "s/chat.yaml", "--no-plots") == 0
    before = snapshot(here / "runs" / "chat")
    capsys.readouterr()
    assert run("simulate", "s/other.yaml", "--no-plots") == 2
    err = capsys.readouterr().err
    assert err == ("kvplan: error: runs/chat: holds a run of s/chat.yaml (kvplan simulate), not of "
                   "s/other.yaml (kvplan simulate): give another --out, or --replace to replace it\n")
    assert snapshot(here / "runs" / "chat") == before  # nothing lost
    assert run("simulate", "s/other.yaml", "--no-plots", "--replace") == 0
    warned = capsys.readouterr().err
    assert warned.count("\n") == 1 and "replacing a run of s/chat.yaml" in warned
    marker = json.loads((here / "runs" / "chat" / MARKER).read_text())
    assert marker["inputs"] == [str(here / "s" / "other.yaml")] and marker["shown"] == "s/other.yaml"


def test_the_same_scenario_with_other_settings_is_replaced_with_a_warning(
        here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("simulate", "s/chat.yaml", "--no-plots") == 0
    assert run("simulate", "s/chat.yaml", "--no-plots") == 0
    assert capsys.readouterr().err == ""  # the same run again: nothing to say
    assert run("simulate", "s/chat.yaml", "--no-plots", "--set", "block_size=32") == 0
    assert capsys.readouterr().err == (
        "kvplan: warning: runs/chat: this run replaces the one of s/chat.yaml (kvplan simulate) made "
        "with other settings (keep both with another --out)\n")
    # an edit of the file is other settings too
    path = here / "s" / "chat.yaml"
    path.write_text(path.read_text().replace("rate: 20", "rate: 10"))
    assert run("simulate", "s/chat.yaml", "--no-plots", "--set", "block_size=32") == 0
    assert "made with other settings" in capsys.readouterr().err


def test_another_command_into_a_run_folder_is_refused(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run("simulate", "s/chat.yaml", "--no-plots") == 0
    capsys.readouterr()
    assert run("export", "s/chat.yaml", "--out", "runs/chat") == 2
    assert "holds a run of s/chat.yaml (kvplan simulate), not of s/chat.yaml (kvplan export)" in \
        capsys.readouterr().err
    assert (here / "runs" / "chat" / "summary.json").is_file()


def test_a_folder_from_before_sources_were_recorded_is_replaced(here: Path) -> None:
    assert run("simulate", "s/chat.yaml", "--no-plots") == 0
    (here / "runs" / "chat" / MARKER).write_text('{"command": "simulate", "written_by": "kvplan"}\n')
    assert run("simulate", "s/other.yaml", "--no-plots") == 0


def test_a_full_disk_is_one_line_and_keeps_the_previous_results(
        here: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from matplotlib.figure import Figure

    assert run("simulate", "s/chat.yaml") == 0
    before = snapshot(here / "runs" / "chat")
    capsys.readouterr()

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Figure, "savefig", full)
    assert run("simulate", "s/chat.yaml") == 2
    assert capsys.readouterr().err == ("kvplan: error: runs/chat: cannot write the results: No space left "
                                       "on device; the previous results are as they were\n")
    assert snapshot(here / "runs" / "chat") == before
    assert sorted(p.name for p in (here / "runs").iterdir()) == ["chat"]  # no staging folder left


def test_a_missing_input_read_during_the_run_is_not_called_a_write_failure(tmp_path: Path) -> None:
    from simulator.report.outputs import open_output

    with pytest.raises(FileNotFoundError), open_output(tmp_path / "o", command="test"):
        open(tmp_path / "no-such-trace.csv", encoding="utf-8")
