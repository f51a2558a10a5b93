"""Checks every test shares.

The checkout's ``runs/`` is the user's: their results from README's commands live there. A test
neither reads it (tests/test_readme.py makes the run folders its commands need) nor writes it:
every test gives its commands an ``--out`` (or a working folder) under ``tmp_path``. The fixture
below fails a test that created, replaced or removed anything at the top of ``runs/``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

RUNS = Path(__file__).resolve().parents[1] / "runs"


def _state() -> dict[str, tuple[int, int]] | None:
    """(inode, mtime) of ``runs/`` and of each entry at its top: a swap, a new folder or a new
    file in one of them changes it. None when there is no ``runs/``."""
    try:
        names = os.listdir(RUNS)
    except FileNotFoundError:
        return None
    state = {}
    for name in [".", *names]:
        try:
            st = os.stat(RUNS / name)
        except FileNotFoundError:
            continue
        state[name] = (st.st_ino, st.st_mtime_ns)
    return state


@pytest.fixture(autouse=True)
def _leave_the_checkouts_runs_alone() -> Iterator[None]:
    before = _state()
    yield
    assert _state() == before, (f"this test wrote into {RUNS}, the user's results: give its commands "
                                "an --out (or a working folder) under tmp_path")
