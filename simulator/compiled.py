"""The simulator's hot modules, compiled: which are in use, and a guard against stale builds.

``pip install`` compiles the modules in :data:`HOT_MODULES` with Cython when it can (setup.py).
Compiled, they run the *same source*: Cython keeps Python's semantics (setup.py turns off the
one directive that would not: typing variables from their annotations), so every output is the
same, bit for bit, only faster; where the build cannot compile (no C compiler), the modules
run as plain Python. tests/simulator/test_compiled.py runs bundled scenarios both ways and compares
the files byte for byte; ``python benchmarks/simulate.py`` times both in the same run.

An editable install puts the compiled modules next to their sources, so an edited source would
be shadowed by its old build. The build records each compiled source's SHA-256
(``simulator/_compiled.json``); on import, a module whose source no longer matches runs from the
source, as does every module when ``KVPLAN_PURE_PYTHON=1`` (for profilers that read Python
frames, and to compare). ``pip install -e .`` again rebuilds.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

# Modules compiled by setup.py: the per-step path of every serving engine (the scheduler, the
# allocators it drives, the step log, the latency models and the engine loop). A module not here
# (the workloads, metrics, writers, contiguous and hybrid allocators) always runs from source.
HOT_MODULES = (
    "simulator.engine.core",
    "simulator.engine.steps",
    "simulator.scheduler.router",
    "simulator.scheduler.plan",
    "simulator.scheduler.core",
    "simulator.scheduler.v0",
    "simulator.scheduler.v1",
    "simulator.scheduler.sglang",
    "simulator.scheduler.state",
    "simulator.kv.allocator",
    "simulator.kv.paged",
    "simulator.kv.prefix",
    "simulator.kv.radix",
    "simulator.latency.roofline",
    "simulator.latency.profile",
)

PURE_ENV = "KVPLAN_PURE_PYTHON"  # set to 1: run every module from its source
MANIFEST = "_compiled.json"  # written by the build next to this file: {module: source SHA-256}
PACKAGE_DIR = Path(__file__).resolve().parent


def source_path(module: str) -> Path:
    """The ``.py`` source of one of :data:`HOT_MODULES`."""
    return PACKAGE_DIR.parent.joinpath(*module.split(".")).with_suffix(".py")


def source_digest(path: Path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


class _StaleBuildFinder:
    """A meta-path finder in front of the default ones: for a hot module whose compiled build
    is stale (or when :data:`PURE_ENV` is set) it finds the source; otherwise it finds nothing
    and the default finders load the compiled module, which they prefer."""

    def __init__(self, pure: bool) -> None:
        self.pure = pure
        self._digests: dict[str, str] | None = None

    def recorded(self) -> dict[str, str]:
        if self._digests is None:
            import json
            try:
                self._digests = json.loads((PACKAGE_DIR / MANIFEST).read_text())["modules"]
            except (OSError, ValueError, KeyError, TypeError):
                self._digests = {}
        return self._digests

    def reason(self, module: str) -> str | None:
        """Why the hot ``module`` must run from its source, or None: its build is current."""
        if self.pure:
            return f"{PURE_ENV} is set"
        if self.recorded().get(module) != source_digest(source_path(module)):
            return "its source changed since the build (pip install -e . rebuilds)"
        return None

    def find_spec(self, fullname, path=None, target=None):  # type: ignore[no-untyped-def]
        if fullname not in HOT_MODULES or self.reason(fullname) is None:
            return None
        import importlib.util
        return importlib.util.spec_from_file_location(fullname, source_path(fullname))


_finder: _StaleBuildFinder | None = None


def install() -> None:
    """Put the guard in front of the import system (once; :mod:`simulator` does it on import).
    Without a compiled build there is nothing to guard and nothing is installed."""
    global _finder
    if _finder is not None or not any(_compiled_file(m) for m in HOT_MODULES):
        return
    _finder = _StaleBuildFinder(pure=os.environ.get(PURE_ENV, "") not in ("", "0"))
    sys.meta_path.insert(0, _finder)  # type: ignore[arg-type]


def _compiled_file(module: str) -> Path | None:
    """The extension module built for ``module`` by this interpreter's build, if any."""
    import importlib.machinery
    base = source_path(module).with_suffix("")
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        candidate = base.with_name(base.name + suffix)
        if candidate.is_file():
            return candidate
    return None


def build_status() -> dict[str, str]:
    """How each hot module runs in this process, or would once imported: ``compiled``, or
    ``source: <why>`` (no build for this interpreter, a stale build, :data:`PURE_ENV`)."""
    status = {}
    for module in HOT_MODULES:
        loaded = sys.modules.get(module)
        if loaded is not None and not str(getattr(loaded, "__file__", "")).endswith(".py"):
            status[module] = "compiled"
        elif _compiled_file(module) is None:
            status[module] = "source: no compiled build for this interpreter"
        elif _finder is not None and (why := _finder.reason(module)) is not None:
            status[module] = f"source: {why}"
        else:
            status[module] = "compiled" if loaded is None else "source"
    return status


def describe() -> str:
    """One line: how many hot modules run compiled, and why the others do not."""
    status = build_status()
    compiled = sum(1 for s in status.values() if s == "compiled")
    reasons = sorted({s.removeprefix("source: ") for s in status.values() if s != "compiled"})
    line = f"{compiled} of {len(status)} hot modules compiled"
    return line + (f" (others from source: {'; '.join(reasons)})" if reasons else "")
