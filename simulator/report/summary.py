"""What a run prints and puts first: the per-allocator table, the SLO verdict (the headline of
simulate's table and of report.html), the saturation and max_model_len lines."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from rich.console import Console
    from rich.table import Table


def _ms(stats: dict[str, float | None], key: str) -> str:
    v = stats.get(key)
    return "—" if v is None else f"{v * 1000:,.0f}" if v >= 0.1 else f"{v * 1000:,.1f}"


def summary_table(summary: dict[str, dict[str, Any]], title: str) -> Table:
    """Metrics down, allocators across: the numbers a capacity planner reads first."""
    from rich.table import Table  # printed tables only: --quiet runs never import rich

    table = Table(title=title, title_justify="left")
    table.add_column("", justify="left")
    for alloc in summary:
        table.add_column(alloc, justify="right")

    def row(label: str, fmt) -> None:  # type: ignore[no-untyped-def]
        table.add_row(label, *(fmt(s) for s in summary.values()))

    row("completed / rejected", lambda s: f"{s['completed']:,} / {s['rejected']:,}")
    row("throughput req/s", lambda s: f"{s['throughput_req_s']:.2f}")
    row("generated tok/s", lambda s: f"{s['throughput_tok_s']:,.0f}")
    row("TTFT p50 / p99 ms", lambda s: f"{_ms(s['ttft_s'], 'p50')} / {_ms(s['ttft_s'], 'p99')}")
    row("TPOT p50 / p99 ms", lambda s: f"{_ms(s['tpot_s'], 'p50')} / {_ms(s['tpot_s'], 'p99')}")
    row("E2E p50 / p99 s", lambda s: "—" if s["e2e_s"]["p50"] is None
        else f"{s['e2e_s']['p50']:.2f} / {s['e2e_s']['p99']:.2f}")
    if any("saturated" in s for s in summary.values()):
        row("queue over the run", _queue_cell)
    row("batch mean / max", lambda s: f"{s['mean_batch_size']:.1f} / {s['max_batch_size']}")
    row("preemptions", lambda s: f"{s['num_preemptions']:,}")
    row("KV token state", lambda s: f"{s['kv']['token_state']:.1%}")
    row("KV reserved", lambda s: f"{s['kv']['reserved']:.1%}")
    row("KV internal frag.", lambda s: f"{s['kv']['internal_fragmentation']:.1%}")
    row("KV external frag.", lambda s: f"{s['kv']['external_fragmentation']:.1%}")
    if any(s["prefix_hit_rate"] for s in summary.values()):
        row("prefix hit rate", lambda s: f"{s['prefix_hit_rate']:.1%}")
    if any("speculative" in s for s in summary.values()):
        row("spec. accepted length", lambda s: "—" if "speculative" not in s
            else f"{s['speculative']['mean_acceptance_length']:.2f}")
        row("spec. acceptance by position", lambda s: "—" if "speculative" not in s
            else " ".join(f"{a:.0%}" for a in s["speculative"]["acceptance_per_position"]))
    return table


# --- the SLO verdict: the headline of simulate's table and report.html ---------------------------

SLO_BOUNDS = (("ttft_p99_s", "ttft_s", "p99 TTFT"), ("tpot_p99_s", "tpot_s", "p99 TPOT"),
              ("e2e_p99_s", "e2e_s", "p99 E2E"))


def duration_text(seconds: float) -> str:
    """A duration for a sentence: ms below 1 s, three significant digits (``103 ms``, ``2.68 s``)."""
    if seconds * 1e3 < 999.5:  # 999.7 ms would print as "1e+03 ms"
        return f"{seconds * 1e3:.3g} ms"
    return f"{seconds:.3g} s" if seconds < 99.95 else f"{seconds:,.0f} s"


def _over(value: float, bound: float) -> str:
    """``value > bound`` as text, with enough digits that the two never read alike
    (100.04 ms against a 100 ms bound is ``100.04 ms > 100 ms``, not ``100 ms > 100 ms``)."""
    text = duration_text(value)
    for digits in (4, 5, 6, 8):
        if text != duration_text(bound):
            break
        text = (f"{value * 1e3:.{digits}g} ms" if value < 1.0 else f"{value:.{digits}g} s")
    return f"{text} > {duration_text(bound)}"


def slo_text(slo: Mapping[str, Any]) -> str:
    """``p99 TTFT ≤ 2 s, p99 TPOT ≤ 100 ms`` (and the rejected share when it allows any)."""
    parts = [f"{label} ≤ {duration_text(slo[key])}" for key, _, label in SLO_BOUNDS
             if slo.get(key) is not None]
    if slo.get("max_rejected_fraction"):
        parts.append(f"≤ {100 * slo['max_rejected_fraction']:g}% rejected")
    return ", ".join(parts)


def slo_misses(s: Mapping[str, Any], slo: Mapping[str, Any]) -> list[str]:
    """What of ``slo`` (a scenario's ``slo:`` as a mapping) one run's summary ``s`` breaks, each
    a short phrase (``p99 TPOT (103 ms > 100 ms)``); empty when it meets every part. The parts
    are those ``capacity`` checks (simulator.commands.capacity.search.check_slo): the p99 bounds, the
    share of requests rejected at arrival, a queue that grows through the run (``saturated``)."""
    misses = []
    completed, rejected = int(s.get("completed") or 0), int(s.get("rejected") or 0)
    sent = completed + rejected
    allowed = float(slo.get("max_rejected_fraction") or 0.0)
    if sent and rejected / sent > allowed:
        misses.append(f"the rejected share ({rejected / sent:.2%} of requests > {100 * allowed:g}%)")
    if completed == 0:
        misses.append("no request finished")
    for key, metric, label in SLO_BOUNDS:
        bound, value = slo.get(key), (s.get(metric) or {}).get("p99")
        if bound is not None and value is not None and value > bound:
            misses.append(f"{label} ({_over(value, bound)})")
    if s.get("saturated"):
        growth = round(float(s.get("queue_growth_s_per_s") or 0.0), 2) + 0.0  # + 0.0: no "-0.00"
        misses.append(f"a stable queue (saturated: it grows {growth:+.2f} s/s)")
    return misses


def slo_headline(summary: Mapping[str, Mapping[str, Any]], slo: Mapping[str, Any] | None, *,
                 name: Callable[[str], str] = str, text: Callable[[str], str] = str) -> str:
    """One sentence on which runs (allocators, or engine/allocator) meet ``slo`` and what each
    of the others misses; the lowest p99 TTFT is named only among those that meet it. Without
    an SLO, the lowest p99 TTFT of several runs (one run: ""). ``name`` formats a run's name and
    ``text`` everything else (report.html bolds the one and escapes both); "" without runs."""
    if not summary:
        return ""

    def ttft(run: str) -> float | None:
        value = (summary[run].get("ttft_s") or {}).get("p99")
        return float(value) if isinstance(value, (int, float)) else None

    def lowest(runs: list[str]) -> str:
        timed = {r: t for r in runs if (t := ttft(r)) is not None}
        if not timed:
            return ""
        best = min(timed, key=timed.__getitem__)
        return name(best) + text(f" ({duration_text(timed[best])})")

    if not slo or not slo_text(slo):
        best = lowest(list(summary)) if len(summary) > 1 else ""
        return text("No SLO in the scenario; lowest p99 TTFT: ") + best + text(".") if best else ""
    misses = {r: slo_misses(s, slo) for r, s in summary.items()}
    meet = [r for r, m in misses.items() if not m]
    missed = [name(r) + text(" misses " + _and(m)) for r, m in misses.items() if m]
    bound = text(f"the SLO ({slo_text(slo)})")
    if len(summary) == 1:
        run = next(iter(summary))
        return name(run) + (text(" meets ") + bound if run in meet
                            else text(" misses ") + bound + text(": " + _and(misses[run]))) + text(".")
    what = "engine/allocator" if any("/" in r for r in summary) else "allocator"
    if not meet:
        return text(f"No {what} meets ") + bound + text(": ") + text("; ").join(missed) + text(".")
    if not missed:
        return text(f"Every {what} meets ") + bound + text("; the lowest p99 TTFT: ") + lowest(meet) + text(".")
    if len(meet) == 1:
        head = text("Only ") + name(meet[0]) + text(" meets ") + bound
    else:
        head = (text(", ").join(name(r) for r in meet) + text(" meet ") + bound
                + text("; the lowest p99 TTFT among them: ") + lowest(meet))
    return head + text(". ") + text("; ").join(missed) + text(".")


def _and(parts: Sequence[str]) -> str:
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


def print_summary(console: Console, summary: dict[str, dict[str, Any]], deployment: dict[str, Any],
                  title: str, out_dir: Path, *, engines: list[dict[str, Any]] | None = None,
                  slo: Mapping[str, Any] | None = None) -> None:
    """The run's headline table; ``engines``: each engine's deployment when several ran (or each
    pool's, labelled by its ``pool`` key, in a disaggregated run). ``slo``: the scenario's
    ``slo:`` (a mapping), for the line under the table that says which runs meet it."""
    d = deployment
    console.print(
        f"[bold]{title}[/bold]: {d['model']} on {d['gpu']} × TP {d['tensor_parallel']}"
        f" × {d['num_replicas']} replica(s), KV {d['kv_cache_dtype']}, max_model_len"
        f" {d['max_model_len']:,}"
    )
    for e in engines or [d]:
        console.print(
            f"  {e.get('pool') or e['engine']}: block {e['block_size']}, {e['kv_capacity_tokens']:,} KV tokens per"
            f" replica ({e['kv_pool_gib']:.1f} GiB), max_num_seqs {e['max_num_seqs']:,},"
            f" max_num_batched_tokens {e['max_num_batched_tokens']:,}, prefix caching"
            f" {'on' if e['enable_prefix_caching'] else 'off'}")
    what = "per engine/allocator" if engines else "per allocator"
    console.print(summary_table(summary, f"{what} (KV shares are time-averaged over busy time)"))
    rejected = {a: s["rejected_by_reason"] for a, s in summary.items() if s["rejected"]}
    for alloc, reasons in rejected.items():
        console.print(f"rejected at arrival ({alloc}): "
                      + ", ".join(f"{n:,} {why}" for why, n in reasons.items())
                      + " — reject_reason in requests.csv says why")
    policy = next(iter(summary.values()), {}).get("max_model_len_policy")
    if policy is not None:
        console.print(max_model_len_line(policy))
    saturated = saturation_line(summary)
    if saturated:
        console.print(saturated, style="bold")
    verdict = slo_headline(summary, slo)
    if verdict:
        console.print(verdict, style="bold", markup=False, highlight=False)
    console.print(f"results in {out_dir}/")


def _queue_cell(s: dict[str, Any]) -> str:
    if "saturated" not in s:
        return "—"
    growth = round(s["queue_growth_s_per_s"], 2) + 0.0  # + 0.0: no "-0.00"
    return f"{'SATURATED' if s['saturated'] else 'stable'} {growth:+.2f} s/s"


def saturation_line(summary: dict[str, dict[str, Any]]) -> str:
    """One line naming the allocators whose queue grew through the run (simulator.engine.saturation),
    and what that means for the figures; "" when none did."""
    names = [a for a, s in summary.items() if s.get("saturated")]
    if not names:
        return ""
    who = "every allocator" if len(names) == len(summary) > 1 else ", ".join(names)
    return (f"saturated ({who}): the queue grows through the run and latencies with it; "
            "lower --rate or add GPUs")


def max_model_len_line(policy: dict[str, Any]) -> str:
    """Which ``max_model_len_policy`` applied and how many requests it touched (one line)."""
    head = f"max_model_len {policy['max_model_len']:,}, policy {policy['policy']}: "
    if policy["policy"] == "reject":
        return head + f"{policy['num_rejected']:,} requests over the window refused (vLLM's server: 400)"
    return head + (f"{policy['num_truncated']:,} outputs cut at the window, {policy['num_dropped']:,}"
                   " requests dropped (prompt alone fills it)")
