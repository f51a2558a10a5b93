"""The hot modules compiled by the build (simulator/compiled.py, setup.py) against their sources.

Compiled and plain runs of the same scenario write the same files, byte for byte. Where the
build compiled nothing (no C compiler) both runs are plain and the comparison still checks that
two fresh processes agree. The stale-build guard is checked on its own.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simulator import compiled
from simulator.compiled import HOT_MODULES, PURE_ENV, _StaleBuildFinder, source_digest, source_path

ROOT = Path(__file__).resolve().parents[2]


def run_simulate(scenario: str, out: Path, *, pure: bool) -> str:
    """Run ``kvplan simulate`` in a fresh process; return how its hot modules ran."""
    env = {k: v for k, v in os.environ.items() if k != PURE_ENV}
    if pure:
        env[PURE_ENV] = "1"
    code = ("import sys, simulator.cli, simulator.compiled as c\n"
            "try:\n    simulator.cli.main(sys.argv[1:])\n"
            "finally:\n    print(c.describe(), file=sys.stderr)\n")
    done = subprocess.run(
        [sys.executable, "-c", code, "simulate", f"scenarios/{scenario}.yaml", "--out", str(out),
         "--no-plots", "--quiet", "--steps", "full", "--num-requests", "300"],
        cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return done.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("scenario", ["chat", "engines-prefix", "cluster"])
def test_compiled_and_plain_runs_write_the_same_files(scenario, tmp_path):
    """chat: V1 with paged and contiguous allocators; engines-prefix: V0, V1 and SGLang with
    prefix caching (radix tree); cluster: several replicas behind the router."""
    built = run_simulate(scenario, tmp_path / "built", pure=False)
    plain = run_simulate(scenario, tmp_path / "plain", pure=True)
    assert plain.startswith(f"0 of {len(HOT_MODULES)} hot modules compiled"), plain
    files = sorted(p.relative_to(tmp_path / "plain") for p in (tmp_path / "plain").rglob("*")
                   if p.is_file() and p.name != "run.json")
    assert any(f.name == "steps.csv" for f in files) and any(f.name == "requests.csv" for f in files)
    for name in files:
        assert (tmp_path / "built" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes(), \
            f"{name} differs ({built})"


def test_every_hot_module_runs_from_source_under_the_environment_switch():
    code = ("import importlib, simulator.compiled as c\n"
            "print(' '.join(importlib.import_module(m).__file__ for m in c.HOT_MODULES))")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, PURE_ENV: "1"}, check=True)
    files = done.stdout.split()
    assert files == [str(source_path(m)) for m in HOT_MODULES]


def test_a_stale_build_runs_from_source():
    """A module whose source no longer matches the digest the build recorded is found as its
    source; a matching one is left to the default finders (which prefer the compiled file)."""
    module = "simulator.engine.steps"
    finder = _StaleBuildFinder(pure=False)
    finder._digests = {module: source_digest(source_path(module))}
    assert finder.reason(module) is None and finder.find_spec(module) is None
    finder._digests = {module: "0" * 64}
    assert "changed since the build" in finder.reason(module)
    spec = finder.find_spec(module)
    assert spec is not None and spec.origin == str(source_path(module))
    finder._digests = {}  # not compiled by the build that left the file (or no manifest at all)
    assert finder.find_spec(module).origin == str(source_path(module))
    assert finder.find_spec("simulator.engine.metrics") is None  # not a hot module: not its business
    assert PURE_ENV in _StaleBuildFinder(pure=True).reason(module)


def test_hot_modules_exist_and_the_status_names_each():
    assert all(source_path(m).is_file() for m in HOT_MODULES)
    status = compiled.build_status()
    assert list(status) == list(HOT_MODULES)
    assert all(s == "compiled" or s.startswith("source") for s in status.values())
