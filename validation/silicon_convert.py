#!/usr/bin/env python3
"""Regenerate ``validation/silicon.csv`` from AIConfigurator's silicon sample.

    pip install aiconfigurator-core==0.12.0        # Apache-2.0; or give --sample
    python validation/silicon_convert.py [--sample PATH] [--recipes validation/inferencex_recipes.csv]
                                         [--out validation/silicon.csv] [--check]

``--sample`` defaults to the installed wheel's ``aiconfigurator_core/systems/silicon_sample.csv``
(5,221 rows, sha256 4240bfaf…adb for 0.12.0). Each of its rows becomes a TTFT and a TPOT row
with its provenance (simulator/commands/validate/silicon.py says how each column is derived).
``--recipes`` joins what validation/inferencex_recipes.py read from InferenceX's scripts (served
checkpoint, engine flags, script and commit) by the sample's id; without the file those columns
stay empty. ``--check`` writes nothing and fails if the table on disk differs from what the
sample and recipes give.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from simulator.commands.validate import silicon  # noqa: E402

SAMPLE_SHA256 = "4240bfaf555b6f8b2c62512074e5efbb7791cdbb0344b068408f397588499adb"  # 0.12.0


def installed_sample() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("aiconfigurator_core")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("aiconfigurator-core is not installed (pip install aiconfigurator-core==0.12.0), "
                         "or give --sample PATH")
    return Path(next(iter(spec.submodule_search_locations))) / "systems" / "silicon_sample.csv"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sample", type=Path, help="silicon_sample.csv (default: the installed wheel's)")
    ap.add_argument("--recipes", type=Path, default=HERE / "inferencex_recipes.csv")
    ap.add_argument("--out", type=Path, default=HERE / "silicon.csv")
    ap.add_argument("--check", action="store_true", help="compare with --out instead of writing it")
    args = ap.parse_args(argv)
    sample = args.sample or installed_sample()
    digest = hashlib.sha256(sample.read_bytes()).hexdigest()
    if digest != SAMPLE_SHA256:
        print(f"note: {sample} is not the 0.12.0 sample (sha256 {digest[:12]}…)", file=sys.stderr)
    rows = silicon.convert(silicon.read_sample(sample), silicon.read_recipes(args.recipes))
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            fresh = Path(tmp) / "silicon.csv"
            silicon.write_table(fresh, rows)
            same = args.out.is_file() and fresh.read_bytes() == args.out.read_bytes()
        print(f"{args.out}: {'up to date' if same else 'differs from the sample and recipes'}")
        return 0 if same else 1
    silicon.write_table(args.out, rows)
    print(f"{len(rows)} rows ({len(rows) // 2} measurements) -> {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
