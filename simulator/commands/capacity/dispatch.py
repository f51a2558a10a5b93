"""``kvplan capacity`` run from its parsed arguments: the replica search
(:func:`simulator.commands.capacity.replica_cmd.run`) with ``--target-rate``/``--growth``, else
the rate or concurrency search (:func:`simulator.commands.capacity.cmd.run`). The parser
(:mod:`simulator.commands.capacity.options`) names this function by a string, so building it
imports neither."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    if args.target_rate or args.growth:
        from simulator.commands.capacity import replica_cmd

        return replica_cmd.run(args)
    from simulator.commands.capacity import cmd

    return cmd.run(args)
