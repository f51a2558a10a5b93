"""Ctrl-C during `kvplan capacity` on the process pool, with a real SIGINT to a real process group.

The run is interrupted as soon as its first probe is cached, while each worker is still in the
middle of a search of ~15 probes: a pool that waited for running searches would finish them
(and say so), one that stops at once leaves them unfinished. The waits below are guards against
a hang, not timings.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from simulator.commands.capacity.cmd import run_capacity

KVPLAN = str(Path(sys.executable).with_name("kvplan"))
HANG_GUARD_S = 60.0
SCENARIO: dict[str, Any] = {
    "name": "interrupt", "model": "llama-3.1-8b", "gpu": "h100", "max_num_seqs": 2,
    "allocators": ["paged", "contiguous-max"],
    "latency": {"model": "constant", "step_s": 0.02},
    "workload": {"arrival": {"process": "poisson", "rate": 5.0},
                 "prompt_tokens": {"dist": "fixed", "value": 32},
                 "output_tokens": {"dist": "uniform", "low": 1, "high": 6}, "num_requests": 4000},
    "slo": {"ttft_p99_s": 0.3, "tpot_p99_s": 0.1},
}
ARGS = ("--jobs", "2", "--seeds", "1", "--tolerance", "0.0005", "--no-plots")


def children(pid: int) -> list[int]:
    """Live (not zombie) processes whose parent is ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(entry.name))
    return found


def alive(pids: list[int]) -> list[int]:
    live = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            live.append(pid)
    return live


def _default_sigint() -> None:
    """A terminal's foreground process has SIGINT's default disposition; a test run started in
    the background (``nohup``, ``&`` in a script) ignores SIGINT, and a child inherits that (Python
    then installs no KeyboardInterrupt handler): give the command the terminal's."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupted_run(tmp_path: Path, num_sigints: int) -> tuple[subprocess.CompletedProcess[str], list[int], Path]:
    """Start the sweep in its own process group, SIGINT the group (as a terminal's Ctrl-C does)
    once the first probe is cached, and return the finished process and its worker pids."""
    path = tmp_path / "interrupt.yaml"
    path.write_text(yaml.safe_dump(SCENARIO))
    out = tmp_path / "out"
    proc = subprocess.Popen([KVPLAN, "capacity", str(path), *ARGS, "--out", str(out)], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=_default_sigint)
    cache = out / "cache"
    deadline = time.monotonic() + HANG_GUARD_S
    while not (cache.is_dir() and any(cache.glob("*.json"))):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "no probe cached"
        time.sleep(0.02)
    workers = children(proc.pid)
    for _ in range(num_sigints):
        os.killpg(proc.pid, signal.SIGINT)
        time.sleep(0.05)
    stdout, stderr = proc.communicate(timeout=HANG_GUARD_S)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), workers, out


def assert_stopped_cleanly(done: subprocess.CompletedProcess[str], workers: list[int], out: Path) -> None:
    assert done.returncode == 130, done.stderr
    assert "Traceback" not in done.stderr + done.stdout
    assert len(workers) >= 2  # the pool's workers (and multiprocessing's resource tracker)
    deadline = time.monotonic() + 10.0
    while alive(workers) and time.monotonic() < deadline:  # the tracker leaves on its parent's exit
        time.sleep(0.05)
    assert alive(workers) == []
    assert not list((out / "cache").glob(".tmp-*"))  # no half-written probe
    assert not (out / "capacity.csv").exists()  # nothing written from an unfinished sweep
    assert not [p for p in out.parent.iterdir() if ".kvplan-new" in p.name]  # staging removed


def test_ctrl_c_stops_the_pool_and_the_sweep_resumes(tmp_path: Path) -> None:
    done, workers, out = interrupted_run(tmp_path, num_sigints=1)
    assert_stopped_cleanly(done, workers, out)
    lines = done.stderr.strip().splitlines()
    # the running searches were stopped, not waited for
    assert "capacity interrupted after" in lines[-2] and "0 of 2 searches finished" in lines[-2]
    assert f"probes are cached in {out / 'cache'}: the same command resumes from them" in lines[-2]
    assert lines[-1] == "kvplan: interrupted"
    cached = len(list((out / "cache").glob("*.json")))

    # The same command resumes from the cache: byte for byte what an uninterrupted run writes.
    resumed = subprocess.run([KVPLAN, "capacity", str(tmp_path / "interrupt.yaml"), *ARGS, "--out", str(out),
                              "--quiet"], cwd=tmp_path, capture_output=True, text=True, timeout=HANG_GUARD_S * 4)
    assert resumed.returncode == 0, resumed.stderr
    assert len(list((out / "cache").glob("*.json"))) > cached
    fresh = tmp_path / "fresh"
    run_capacity(str(tmp_path / "interrupt.yaml"), num_seeds=1, tolerance=0.0005, jobs=1, out=str(fresh),
                 plots_on=False, use_cache=False, quiet=True)
    for name in ("capacity.csv", "capacity.json"):
        assert (out / name).read_bytes() == (fresh / name).read_bytes(), name


def test_a_second_ctrl_c_does_not_hang(tmp_path: Path) -> None:
    done, workers, out = interrupted_run(tmp_path, num_sigints=2)
    assert_stopped_cleanly(done, workers, out)
    assert done.stderr.strip().splitlines()[-1] == "kvplan: interrupted"
