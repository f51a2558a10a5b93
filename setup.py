"""Build step: compile the simulator's hot modules with Cython (optional; metadata is in pyproject.toml).

The modules listed in ``simulator.compiled.HOT_MODULES`` are compiled from their unchanged
sources. Cython keeps Python's semantics, except that by default it types a variable annotated
``float`` or ``int`` as a C number; ``annotation_typing`` is off, so only Cython's safe inference
types anything (a few locals that hold a ``len()`` or a flag; every float stays a Python float),
and every output stays the same bit for bit (tests/simulator/test_compiled.py). Without a C
compiler the extensions are skipped (``optional``) and the same modules run as plain Python;
``KVPLAN_PURE_PYTHON=1`` at install time skips them too.

The build records each compiled source's SHA-256 in ``simulator/_compiled.json`` so that an
edited source is not shadowed by a stale build (simulator/compiled.py).
"""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _compiled_module():  # type: ignore[no-untyped-def]
    """simulator/compiled.py on its own (the package is not importable during the build; that
    module imports nothing of it)."""
    spec = importlib.util.spec_from_file_location("_kvplan_compiled", ROOT / "simulator" / "compiled.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_COMPILED = _compiled_module()
HOT_MODULES, MANIFEST, PURE_ENV = _COMPILED.HOT_MODULES, _COMPILED.MANIFEST, _COMPILED.PURE_ENV


# After the interpreter's own flags (and any CFLAGS), so these win. -O3 as CPython's default build
# (a CFLAGS without -O would compile at -O0: slower than the interpreter); -g0: no debug info,
# which took 40% of the compile time. Floating point as Python computes it: no fused
# multiply-add (gcc contracts a*b+c by default wherever the target has FMA, e.g. arm64) and no
# fast-math, so a C double expression rounds as the interpreter's does.
UNIX_FLAGS = ["-O3", "-g0", "-ffp-contract=off", "-fno-fast-math"]


def source_of(module: str) -> Path:
    return _COMPILED.source_path(module).relative_to(ROOT)


def extensions() -> list[Extension]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:  # built without build isolation and without Cython: plain Python
        return []
    modules = [Extension(m, [str(source_of(m))]) for m in HOT_MODULES]
    # force: translate every source again (2 s), never trust a .c file by its timestamp, so the
    # digests recorded below are those of the sources that were compiled
    built = cythonize(modules, build_dir="build/cython", quiet=True, force=True,
                      compiler_directives={"language_level": 3, "annotation_typing": False})
    for ext in built:
        ext.optional = True  # no compiler: a warning, and the module runs from its source
    return built


class BuildExt(build_ext):
    """Compiles on every CPU and writes the manifest of what it compiled."""

    def finalize_options(self) -> None:
        super().finalize_options()
        if not self.parallel:
            self.parallel = os.cpu_count() or 1

    def build_extensions(self) -> None:
        if self.compiler.compiler_type == "unix":  # gcc or clang
            for ext in self.extensions:
                ext.extra_compile_args = [*ext.extra_compile_args, *UNIX_FLAGS]
        super().build_extensions()

    def run(self) -> None:
        super().run()
        # what this build made (an optional extension that failed to compile is not there; in an
        # editable install the build directory is copied next to the sources)
        digests = {ext.name: _COMPILED.source_digest(ROOT / source_of(ext.name))
                   for ext in self.extensions
                   if os.path.exists(os.path.join(self.build_lib, self.get_ext_filename(ext.name)))}
        text = json.dumps({"modules": digests}, indent=1, sort_keys=True) + "\n"
        targets = [Path(self.build_lib) / "simulator"]
        if self.inplace:  # an editable install: the extensions sit next to their sources
            targets.append(Path(self.get_finalized_command("build_py").get_package_dir("simulator")))
        for folder in targets:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / MANIFEST).write_text(text)


setup(ext_modules=extensions(), cmdclass={"build_ext": BuildExt})
