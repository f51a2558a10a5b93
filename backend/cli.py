"""The ``calibrate`` subcommand of ``kvplan`` (registered through the ``kvplan.commands`` entry points).

::

    kvplan calibrate --model Llama-3.1-8B --tp 1 [--device cuda|cpu] [--dtype bf16|fp16|fp32]
                     [--layers k] [--block-size 16] [--kv-cache-dtype auto] [--quick | --full]
                     [--out profiles/<gpu>-<model>.yaml] [--quiet]
    kvplan calibrate --from-results R1 R2 ... --scenario S [--out S-calibrated.yaml]

``--from-results`` fits the roofline's constants to measured benchmark results instead
(simulator/commands/compare/calibrate.py): no device, and no torch imported.

On a CPU the quick sweep is the default (``--full`` asks for the whole one); on a GPU the full
sweep. Before the sweep it prints what it will take (two shapes timed, the sweep extrapolated),
then shows a progress bar with the time remaining (on a terminal, not with ``--quiet``).

``kvplan fidelity`` exits 0 when every target is met (or has no measured value), and otherwise
writes its files and table all the same and exits :data:`EXIT_TARGETS_MISSED` (3) when a target
is missed or the replay's decisions diverged from the real run's, else
:data:`EXIT_INCONCLUSIVE` (4) when some target could not be judged (the run-to-run spread or a
load change exceeds its bound: run it again on a quieter machine). Bad input exits 2.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

# This module is loaded for every `kvplan` command (it adds its subcommands), so it imports nothing
# heavy: the command functions import the backend (torch) and rich's progress bars and tables when
# they run.


def add_calibrate_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``calibrate`` subcommand (its ``func`` runs it and returns the exit code)."""
    p = subparsers.add_parser(
        "calibrate", help="time step shapes on a device and write a latency profile",
        description="Run a Llama-shaped model with random weights at a catalog model's shapes over a sweep "
                    "of decode, prefill and mixed steps; fit the linear step-latency model and write a "
                    "profile that `simulate` can use (latency: {model: profile, profile: FILE}). With "
                    "--from-results: fit the roofline's constants to measured benchmark results instead.")
    p.add_argument("--model", help="catalog model name (e.g. Llama-3.1-8B, tiny); required unless --from-results")
    p.add_argument("--from-results", nargs="+", metavar="RESULT",
                   help="fit the roofline to these measured results (vllm bench serve --save-result JSON, "
                        "GuideLLM report[#N], fidelity.json) of --scenario's deployment; needs no device")
    p.add_argument("--scenario", help="with --from-results: the deployment the results measured")
    p.add_argument("--allocator", help="with --from-results: the allocator to simulate (default: paged)")
    p.add_argument("--max-requests", type=int, metavar="N",
                   help="with --from-results: refuse a result that asks for more than N requests (its "
                        "num_prompts or request total; default 100,000, more than real benchmark runs send)")
    p.add_argument("--tp", type=int, default=1,
                   help="tensor-parallel degree: time one rank's shapes (default 1)")
    p.add_argument("--device", help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument("--dtype", help="compute dtype: bf16, fp16 or fp32 (default: the model's)")
    p.add_argument("--layers", type=int, help="run only k of the L layers and scale their time by L/k")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default 16)")
    p.add_argument("--kv-cache-dtype", default="auto", help="auto (the compute dtype) or fp8 (default auto)")
    size = p.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="quick", action="store_const", const=True,
                      help="the small sweep (the default on a CPU: under a minute for llama-3.1-8b, --layers 1)")
    size.add_argument("--full", dest="quick", action="store_const", const=False,
                      help="the whole sweep (the default on a GPU; on a CPU, minutes per large prefill)")
    p.add_argument("--seed", type=int, default=0, help="seed of the weights and the sweep's contexts")
    p.add_argument("--out", help="profile path (default: profiles/<gpu>-<model>.yaml); with --from-results the "
                                 "calibrated scenario (default: <scenario>-calibrated.yaml beside it)")
    p.add_argument("--threads", type=int, help="torch threads on CPU (default 1: steady timings)")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar and no summary")
    p.set_defaults(func=run_calibrate)
    return p


def run_calibrate(args: argparse.Namespace) -> int:
    """Run ``calibrate`` with parsed arguments; bad input raises KvplanError."""
    from simulator.errors import KvplanError

    if args.from_results:
        if args.scenario is None:
            raise KvplanError("--from-results needs --scenario: the deployment the results measured")
        if args.model is not None:
            raise KvplanError("--model times a device's steps; with --from-results the scenario names the model")
        from simulator.commands.compare.calibrate import run_from_results

        cap = {} if args.max_requests is None else {"max_requests": args.max_requests}
        return run_from_results(args.from_results, args.scenario, out=args.out, allocator=args.allocator,
                                quiet=args.quiet, **cap)
    if args.model is None:
        raise KvplanError("calibrate needs --model (or --from-results RESULT ... --scenario S)")
    if args.scenario is not None or args.allocator is not None or args.max_requests is not None:
        raise KvplanError("--scenario, --allocator and --max-requests go with --from-results")
    import torch
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from backend.calibrate import CalibrateOptions, calibrate, default_out_path, resolve_device, write_profile

    if resolve_device(args.device).type == "cpu":
        torch.set_num_threads(args.threads or 1)  # a shared machine: one thread times steadily
    opts = CalibrateOptions(model=args.model, tp=args.tp, device=args.device, dtype=args.dtype,
                            layers=args.layers, block_size=args.block_size,
                            kv_cache_dtype=args.kv_cache_dtype, quick=args.quick, seed=args.seed)
    hooks: dict[str, Any] = {}
    if not args.quiet:
        hooks["on_stage"] = lambda msg: print(f"calibrate: {msg} ...", file=sys.stderr, flush=True)
        hooks["on_estimate"] = lambda e: print(f"calibrate: {e.describe()}", file=sys.stderr, flush=True)
    if not args.quiet and sys.stderr.isatty():
        with Progress(TextColumn("[bold]calibrate"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      TextColumn("left"), TimeRemainingColumn(), console=Console(stderr=True),
                      transient=True) as progress:
            task = progress.add_task("shapes", total=None)

            def advance(done: int, total: int) -> None:
                progress.update(task, completed=done, total=total)

            result = calibrate(opts, on_shape=advance, **hooks)
    else:
        result = calibrate(opts, **hooks)
    path = write_profile(result.profile, args.out or default_out_path(result.profile))
    if not args.quiet:
        _print_summary(result.profile, result.num_skipped_shapes, str(path))
    return 0


def _print_summary(profile: dict[str, Any], num_skipped: int, path: str) -> None:
    fit, layers = profile["fit"], profile["layers"]
    print(f"calibrated {profile['model']} TP={profile['tensor_parallel']} on {profile['device']} "
          f"({profile['dtype']}, KV {profile['kv_cache_dtype']}, block {profile['block_size']}, "
          f"{layers['run']}/{layers['total']} layers run)")
    skipped = f"; {num_skipped} skipped: too big for this device's memory" if num_skipped else ""
    load = fit.get("machine_load", {})
    print(f"  {fit['num_samples'] + fit['num_heldout']} shapes timed ({fit.get('sweep_size', 'full')} sweep)"
          f"{skipped} in {fit.get('wall_s', 0):.0f} s; load average {_load(load.get('load_1m_before'))} -> "
          f"{_load(load.get('load_1m_after'))} on {load.get('num_cpus') or '?'} CPUs")
    print(f"  MAPE train {_percent(fit['mape_train'])} on {fit['num_samples']} shapes, "
          f"held-out {_percent(fit['mape_heldout'])} on {fit['num_heldout']}")
    coefs = ", ".join(f"{k}={v:.3g}" for k, v in profile["latency_model"]["coefficients_s"].items())
    print(f"  coefficients (s): {coefs}")
    print(f"wrote {path}")


def _load(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.2f}"


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def add_fidelity_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the ``fidelity`` subcommand: real engine vs simulator on one scenario."""
    from simulator.report.outputs import add_replace_arg

    p = subparsers.add_parser(
        "fidelity", help="replay a scenario on the real engine and in the simulator; compare",
        description="Calibrate this device (or take --profile), serve the scenario's trace on the real "
                    "engine in wall-clock time, replay it in the simulator, and report how far the "
                    "simulated throughput and latencies are from the measured ones.")
    p.add_argument("scenario", help="scenario YAML (e.g. scenarios/fidelity-cpu.yaml)")
    p.add_argument("--device", help="cuda, cuda:N or cpu (default: cuda when available)")
    p.add_argument("--profile", help="use this latency profile instead of calibrating")
    p.add_argument("--quick-calibrate", action="store_true",
                   help="the small calibration sweep (already the default on a CPU)")
    p.add_argument("--repeats", type=int, default=2, help="real runs, for the measurement's own spread (default 2)")
    p.add_argument("--threads", type=int, help="torch threads on CPU (default 1: steady timings)")
    p.add_argument("--num-requests", type=int, help="use the first N requests")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="override a scenario key")
    p.add_argument("--out", help="output folder (default: runs/<scenario>-fidelity/)")
    add_replace_arg(p)
    p.add_argument("--force", action="store_true", help="accept a profile measured for another setup")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress and no table")
    p.set_defaults(func=run_fidelity_cmd)
    return p


def run_fidelity_cmd(args: argparse.Namespace) -> int:
    from backend.fidelity import FidelityOptions, run_fidelity
    from simulator.config.overrides import scenario_overrides

    overrides = scenario_overrides(num_requests=args.num_requests, extra=args.set)
    opts = FidelityOptions(scenario=args.scenario, device=args.device, profile=args.profile,
                           repeats=args.repeats, out=args.out, force=args.force,
                           quick_calibrate=args.quick_calibrate, threads=args.threads, overrides=overrides,
                           replace=args.replace)
    say = (lambda msg: print(f"fidelity: {msg} ...", file=sys.stderr)) if not args.quiet else None
    result = run_fidelity(opts, on_stage=say)
    code, why = fidelity_exit_code(result.report)
    if not args.quiet:
        print_fidelity(result.report)
        print(f"results in {result.out_dir}/")
        if code:
            print(f"kvplan: fidelity: {why} (exit status {code})", file=sys.stderr)
    return code


EXIT_TARGETS_MISSED = 3  # a target missed, or the replayed decisions diverged from the real run's
EXIT_INCONCLUSIVE = 4  # none missed, but the measurement could not judge some target


def fidelity_exit_code(report: dict[str, Any]) -> tuple[int, str]:
    """The exit status a fidelity report deserves (module docstring), and why in a few words.

    A miss outranks an inconclusive verdict: a target the measurement could judge and found
    broken is a failure whatever the others say. "n/a" (nothing measured) judges nothing."""
    r = report["allocators"]["paged"]
    verdicts = {name: _raw_verdict(t) for name, t in r["targets"].items()}
    missed = [name for name, v in verdicts.items() if v == "missed"]
    reasons = [f"targets missed: {', '.join(missed)}"] if missed else []
    if not r["decisions"]["identical"]:
        reasons.append("the replayed decisions diverged")
    if reasons:
        return EXIT_TARGETS_MISSED, "; ".join(reasons)
    unjudged = [name for name, v in verdicts.items() if v == "inconclusive"]
    if unjudged:
        return EXIT_INCONCLUSIVE, f"inconclusive: {', '.join(unjudged)}"
    return 0, ""


def _raw_verdict(target: dict[str, Any]) -> str:
    """met | missed | inconclusive | n/a (a report without ``verdict`` has only ``met``)."""
    return target.get("verdict") or ("met" if target["met"] else "missed")


def print_fidelity(report: dict[str, Any]) -> None:
    """The fidelity table: measured, simulated, error, the measurement's own spread, target."""
    from rich.console import Console
    from rich.table import Table

    r = report["allocators"]["paged"]
    table = Table(title=f"fidelity of {report['scenario']} on {report['device']} (paged)", title_justify="left")
    for col in ("metric", "measured", "simulated", "error", "run-to-run", "target"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for name, m in r["metrics"].items():
        err = m["relative_error"]
        spread = r["measurement_spread"].get(name)
        target = r["targets"].get(name)
        table.add_row(
            name, _num(m["measured"]), _num(m["simulated"]), "—" if err is None else f"{err:+.1%}",
            "—" if spread is None else f"{spread:.1%}",
            "" if target is None else f"±{target['bound']:.0%} {_verdict(target)}",
        )
    console = Console() if sys.stdout.isatty() else Console(width=110)
    console.print(table)
    for name, target in r["targets"].items():
        if target.get("reason"):
            console.print(f"{name}: {target.get('verdict', '')}: {target['reason']}")
    machine = report.get("machine_load")
    if machine is not None:
        stages = ", ".join(f"{x['stage']} {_load(x['load_1m_before'])}->{_load(x['load_1m_after'])}"
                           for x in machine["stages"])
        cpus = next((x["num_cpus"] for x in machine["stages"] if x["num_cpus"]), None)
        shift = machine["timing_shift"]
        console.print(f"machine load average (1 min, {cpus or '?'} CPUs) before->after: "
                      f"{stages or 'not measured'}"
                      + ("" if shift is None else f"; timing shift it implies ~{shift:.0%}"))
    d, s, load = r["decisions"], r["steps"], r["load"]
    console.print(f"per-step latency: MAPE {s['mape']:.1%}, bias {s['bias']:+.1%} over {s['num_steps']} steps")
    console.print(f"load: peak KV {load['peak_kv_used']:.0%} of the pool, {load['num_preemptions']} preemptions")
    verdict = "identical" if d["identical"] else f"DIVERGED: {d['first_divergence']}"
    console.print(f"decisions with the measured step times replayed: {verdict} "
                  f"({d['num_steps_real']} steps, {d['preemptions_real']} preemptions)")
    if report["skipped_allocators"]:
        console.print(f"skipped (the real engine serves paged KV only): {', '.join(report['skipped_allocators'])}")


def _verdict(target: dict[str, Any]) -> str:
    verdict = _raw_verdict(target)
    return {"missed": "MISSED", "inconclusive": "inconclusive"}.get(verdict, verdict)


def _num(v: float | None) -> str:
    return "—" if v is None else f"{v:.4g}"
