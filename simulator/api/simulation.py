"""``simulate`` from Python: a scenario -> a :class:`Plan` (validated, deployments resolved, what
vLLM would refuse refused) -> a :class:`Result` (every engine × allocator run, typed summaries,
pandas tables, figures, and the folder ``kvplan simulate`` writes).

``kvplan simulate`` is this module plus a results folder and a printed table
(:mod:`simulator.commands.simulate`): the same scenario and seed give the same numbers, byte for
byte, from either.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simulator.config.deployment import Deployment, build_deployment
from simulator.config.overrides import RATE_KEY_REPLACES
from simulator.config.scenario import Scenario, canonical_allocator, load_scenario, parse_scenario, set_dotted
from simulator.engine.runs import AllocatorRun, client_policy, load_workload, run_allocator
from simulator.engine.steps import DEFAULT_BIN_S
from simulator.errors import KvplanError

if TYPE_CHECKING:  # pragma: no cover
    import pandas as pd
    from matplotlib.figure import Figure
    from rich.progress import Progress

    from workloads.synthetic import ModelLenFit

# The CLI's flags that are not scenario keys, as keyword arguments (simulate --rate, --num-requests,
# --allocator): the dotted keys they set.
FLAG_KEYS = {"rate": "workload.rate", "num_requests": "workload.num_requests", "allocators": "allocators"}


def dotted_overrides(overrides: Mapping[str, object] | None, keywords: Mapping[str, object]) -> dict[str, object]:
    """``overrides`` (dotted keys, as ``--set``) and keyword arguments (``__`` for a dot, or one
    of :data:`FLAG_KEYS`) as one dict of dotted keys; a rate given here replaces the scenario's
    way of giving one, as on the command line (:data:`simulator.config.overrides.RATE_KEY_REPLACES`)."""
    out: dict[str, object] = dict(overrides or {})
    for key, value in keywords.items():
        out[FLAG_KEYS.get(key, key.replace("__", "."))] = value
    if isinstance(out.get("allocators"), (list, tuple, str)):
        names = [out["allocators"]] if isinstance(out["allocators"], str) else out["allocators"]
        out["allocators"] = [canonical_allocator(str(a)) for a in names]  # type: ignore[union-attr]
    for key, others in RATE_KEY_REPLACES.items():
        if key in out:
            for other in others:
                out.setdefault(other, None)
    return out


@dataclass(frozen=True)
class Plan:
    """A validated scenario and the deployments it resolves to, before anything is simulated.

    ``deployments``: one per engine the scenario lists (``engine:``, or ``engines:``), or for a
    disaggregated scenario ``{"prefill": ..., "decode": ...}``. ``where`` is what error messages
    name (the scenario file). Printing ``plan.describe()`` shows what ``simulate`` prints above
    its table: the model, GPU, TP, KV pool in tokens and GiB, the engine's knobs."""

    scenario: Scenario
    base_dir: Path
    where: str
    deployments: dict[str, Deployment]
    path: Path | None = None  # the scenario file, when the plan came from one

    @property
    def disaggregated(self) -> bool:
        return self.scenario.disaggregation is not None

    @property
    def deployment(self) -> Deployment:
        """The deployment the run's figures are labelled by: the first engine's, or the decode pool's."""
        return self.deployments["decode"] if self.disaggregated else next(iter(self.deployments.values()))

    def describe(self) -> dict[str, Any]:
        """Each deployment as run.json records it (model, GPU, TP, KV pool, engine knobs)."""
        return {name: dep.describe() for name, dep in self.deployments.items()}


def load(scenario: str | Path | Scenario | Mapping[str, Any], /, *, overrides: Mapping[str, object] | None = None,
         force_profile: bool = False, base_dir: str | Path | None = None, **keywords: object) -> Plan:
    """Read, override and validate a scenario and resolve its deployments.

    ``scenario``: a YAML file, a parsed mapping (as the file would hold it) or a
    :class:`~simulator.config.scenario.Scenario`. Relative paths in it (a trace, a profile)
    resolve against the file's folder, or ``base_dir`` (default: the working folder) for a
    mapping. ``force_profile``: accept a latency profile measured for another setup (``--force``).
    Raises :class:`~simulator.errors.ScenarioError` for an invalid scenario,
    :class:`~simulator.errors.RefusedError` for a deployment vLLM would refuse to start."""
    dotted = dotted_overrides(overrides, keywords)
    path: Path | None = None
    if isinstance(scenario, (str, Path)):
        path = Path(scenario)
        where = str(scenario)
        parsed, folder = load_scenario(scenario, dotted)
    else:
        where = "scenario"
        if isinstance(scenario, Scenario):
            data = scenario.model_dump(mode="json", exclude_unset=True)
        elif isinstance(scenario, Mapping):
            import copy

            data = copy.deepcopy(dict(scenario))
        else:
            raise KvplanError(f"a scenario is a file path, a mapping or a Scenario, got {type(scenario).__name__}")
        for key, value in dotted.items():
            set_dotted(data, key, value)
        parsed = parse_scenario(data, where)
        folder = Path(base_dir) if base_dir is not None else Path.cwd()
    if parsed.disaggregation is not None:
        from simulator.engine.disagg import CLOSED_LOOP_REFUSED, build_pools

        if parsed.workload.closed_loop:
            raise KvplanError(f"{where}: {CLOSED_LOOP_REFUSED}")
        prefill, decode = build_pools(parsed, folder, force_profile=force_profile, where=where)
        deployments = {"prefill": prefill, "decode": decode}
    else:
        deployments = {e: build_deployment(parsed.for_engine(e), folder, force_profile=force_profile, where=where)
                       for e in parsed.engines}
    return Plan(parsed, folder, where, deployments, path)


def simulate(scenario: str | Path | Scenario | Mapping[str, Any] | Plan, /, *,
             overrides: Mapping[str, object] | None = None, steps: str = "bins",
             step_bin_s: float = DEFAULT_BIN_S, force_profile: bool = False, progress: bool = False,
             **keywords: object) -> Result:
    """Simulate every engine × allocator of ``scenario`` (see :func:`load`) on its workload.

    ``steps``: ``"bins"`` (one step row per replica per ``step_bin_s`` seconds, as ``simulate``
    writes by default) or ``"full"`` (every engine step). ``progress``: a progress bar on a
    terminal's stderr. Keyword arguments are overrides (module docstring of :mod:`simulator.api`)."""
    plan = scenario if isinstance(scenario, Plan) else load(
        scenario, overrides=overrides, force_profile=force_profile, **keywords)
    if isinstance(scenario, Plan) and (overrides or keywords):
        raise KvplanError("a Plan is already resolved: give the overrides to api.load")
    if steps not in ("bins", "full"):
        raise KvplanError(f"steps must be 'bins' or 'full', got {steps!r}")
    if not step_bin_s > 0 or step_bin_s == float("inf"):
        raise KvplanError(f"step_bin_s must be a positive, finite number of seconds, got {step_bin_s}")
    from simulator.report.progress import make_progress

    bar = make_progress(not progress)
    if bar is None:
        return run(plan, steps=steps, step_bin_s=step_bin_s)
    with bar:
        return run(plan, steps=steps, step_bin_s=step_bin_s, progress=bar)


@dataclass(frozen=True)
class Workload:
    """A plan's requests (after its ``max_model_len_policy``) and the clients that send them."""

    fit: ModelLenFit
    clients: Any


def workload(plan: Plan) -> Workload:
    """Build (and check) the plan's requests: a trace is read here, so a bad one fails before
    anything is simulated or written."""
    fit = load_workload(plan.scenario, plan.base_dir, plan.deployment.scheduler_config.max_model_len)
    return Workload(fit, client_policy(plan.scenario, len(fit.requests)))


def run(plan: Plan, *, steps: str = "bins", step_bin_s: float = DEFAULT_BIN_S,
        progress: Progress | None = None, requests: Workload | None = None) -> Result:
    """Simulate a resolved :class:`Plan` (``simulate`` does this after :func:`load`);
    ``requests``: the plan's :func:`workload`, when already built."""
    scenario = plan.scenario
    built = requests if requests is not None else workload(plan)
    fit, clients = built.fit, built.clients
    if plan.disaggregated:
        return _run_disaggregated(plan, fit, clients, steps, step_bin_s, progress)
    several = len(plan.deployments) > 1  # one engine: a run per allocator, named by it; several: engine/allocator
    runs = {}
    for engine, dep in plan.deployments.items():
        for allocator in scenario.allocators_of(engine):
            name = f"{engine}/{allocator}" if several else allocator
            runs[name] = run_allocator(dep, allocator, fit.requests, clients=clients, progress=progress,
                                       record_steps=steps, step_bin_s=step_bin_s, name=name)
    for r in runs.values():
        r.summary["max_model_len_policy"] = fit.as_dict()
    return Result(plan, runs, fit)


def _run_disaggregated(plan: Plan, fit: ModelLenFit, clients: Any, steps: str, step_bin_s: float,
                       progress: Progress | None) -> Result:
    import numpy as np

    from simulator.engine.disagg import simulate_disaggregated

    prefill, decode = plan.deployments["prefill"], plan.deployments["decode"]
    assert plan.scenario.disaggregation is not None
    merged, run_p, run_d = simulate_disaggregated(prefill, decode, plan.scenario.disaggregation.link, fit.requests,
                                                  clients=clients, progress=progress, record_steps=steps,
                                                  step_bin_s=step_bin_s)
    merged.summary["max_model_len_policy"] = fit.as_dict()
    pools = (("prefill", prefill.scenario.num_replicas), ("decode", decode.scenario.num_replicas))
    # a request is sent to a prefill replica, then (once prefilled) to a decode replica
    routed = [np.asarray(r.request_columns["replica"], dtype=np.int64) for r in (run_p, run_d)]
    sent = np.concatenate([np.bincount(x[x >= 0], minlength=n)[:n] for x, (_, n) in zip(routed, pools)])
    return Result(plan, {merged.name: merged}, fit, pools=pools, sent={merged.name: sent},
                  num_replicas=sum(n for _, n in pools))


@dataclass(frozen=True)
class Latency:
    """One latency's statistics over the measured requests, in seconds (None: no request)."""

    mean: float | None
    p50: float | None
    p90: float | None
    p99: float | None

    @classmethod
    def of(cls, stats: Mapping[str, Any] | None) -> Latency:
        stats = stats or {}
        return cls(*(stats.get(k) for k in ("mean", "p50", "p90", "p99")))


@dataclass(frozen=True)
class KVShares:
    """The KV pool over the run's busy time, as shares of its capacity (summary.json's ``kv``)."""

    token_state: float
    reserved: float
    internal_fragmentation: float
    external_fragmentation: float
    free: float
    shared_saved: float
    peak_token_state: float
    capacity_tokens: int


@dataclass(frozen=True)
class RunSummary:
    """One run's headline figures (summary.json's entry for it, typed). ``raw`` is the whole
    entry, for the figures this class does not name (speculative, kv_offload, per replica...)."""

    name: str
    completed: int
    rejected: int
    throughput_req_s: float
    throughput_tok_s: float
    ttft: Latency
    tpot: Latency
    e2e: Latency
    queue_delay: Latency
    mean_batch_size: float
    max_batch_size: int
    num_preemptions: int
    prefix_hit_rate: float
    kv: KVShares
    saturated: bool | None
    raw: Mapping[str, Any] = field(repr=False)

    @classmethod
    def of(cls, name: str, raw: Mapping[str, Any]) -> RunSummary:
        kv = raw.get("kv", {})
        shares = KVShares(**{f.name: kv.get("kv_capacity_tokens" if f.name == "capacity_tokens" else f.name, 0)
                             for f in fields(KVShares)})
        return cls(name=name, completed=raw["completed"], rejected=raw["rejected"],
                   throughput_req_s=raw["throughput_req_s"], throughput_tok_s=raw["throughput_tok_s"],
                   ttft=Latency.of(raw.get("ttft_s")), tpot=Latency.of(raw.get("tpot_s")),
                   e2e=Latency.of(raw.get("e2e_s")), queue_delay=Latency.of(raw.get("queue_delay_s")),
                   mean_batch_size=raw["mean_batch_size"], max_batch_size=raw["max_batch_size"],
                   num_preemptions=raw["num_preemptions"], prefix_hit_rate=raw["prefix_hit_rate"],
                   kv=shares, saturated=raw.get("saturated"), raw=raw)


@dataclass
class Result:
    """What a simulation produced: ``runs`` by name (an allocator, or ``engine/allocator`` when
    the scenario lists several engines), each an :class:`~simulator.engine.runs.AllocatorRun`
    (the engine's result, its request columns and summary)."""

    plan: Plan
    runs: dict[str, AllocatorRun]
    workload: ModelLenFit
    pools: tuple[tuple[str, int], ...] = ()  # a disaggregated run's pools and their replicas
    sent: dict[str, Any] | None = None
    num_replicas: int | None = None

    @property
    def scenario(self) -> Scenario:
        return self.plan.scenario

    @property
    def summaries(self) -> dict[str, dict[str, Any]]:
        """Every run's summary as summary.json holds it."""
        return {name: r.summary for name, r in self.runs.items()}

    @functools.cached_property
    def summary(self) -> dict[str, RunSummary]:
        """Every run's headline figures, typed (:class:`RunSummary`)."""
        return {name: RunSummary.of(name, r.summary) for name, r in self.runs.items()}

    @functools.cached_property
    def requests(self) -> pd.DataFrame:
        """One row per request of every run (requests.csv): ``allocator`` names the run."""
        import pandas as pd

        return pd.concat([r.requests.assign(allocator=name) for name, r in self.runs.items()],
                         ignore_index=True)[["allocator", *self._request_columns()]]

    @functools.cached_property
    def steps(self) -> pd.DataFrame:
        """The step rows of every run (steps.csv: per bin, or per step with ``steps="full"``)."""
        import pandas as pd

        from simulator.engine.steps import STEP_COLUMNS

        return pd.concat([r.steps.assign(allocator=name) for name, r in self.runs.items()],
                         ignore_index=True)[["allocator", *STEP_COLUMNS]]

    @property
    def headline(self) -> str:
        """Which runs meet the scenario's ``slo:`` and what each other misses (simulate's verdict
        line); "" without an ``slo:``."""
        from simulator.report.summary import slo_headline

        slo = self.scenario.slo
        return slo_headline(self.summaries, slo.model_dump() if slo else None)

    def plot(self, name: str = "latency_cdf") -> Figure:
        """One of ``simulate``'s figures as a matplotlib Figure: ``kv_memory``, ``batch_size``,
        ``latency_cdf`` or ``allocators`` (:data:`simulator.report.plots.FIGURES`)."""
        from simulator.report.plots import build_figure
        from simulator.report.run_folder import plot_inputs

        inputs = plot_inputs(self.scenario, self.plan.deployment, list(self.runs.values()),
                             deployments=self.plan.deployments if self.pools else None, pools=self.pools)
        return build_figure(name, inputs.steps, inputs.requests, self.summaries, **inputs.figure_args())

    def write(self, out: str | Path | None = None, *, plots: bool = True, replace: bool = False) -> Path:
        """Write the folder ``kvplan simulate`` writes (default ``runs/<scenario name>/``), through
        the same safe swap: a folder holding another scenario's run is refused unless
        ``replace`` (:mod:`simulator.report.outputs`). Returns the folder."""
        from simulator.report.outputs import RunSource, default_out_dir, open_output, shown_run
        from simulator.report.run_folder import SIMULATE_FILES

        out_dir = Path(out) if out is not None else default_out_dir(self.scenario.name, where=self.plan.where)
        inputs = [self.plan.path] if self.plan.path is not None else []
        source = RunSource.of("simulate", inputs, self.scenario.model_dump(mode="json"),
                              shown_run(self.plan.where))
        with open_output(out_dir, command="simulate", recognised=SIMULATE_FILES, source=source,
                         replace=replace) as folder:
            self.write_into(folder.staging, plots=plots)
        return out_dir

    def write_into(self, folder: Path, *, plots: bool = True) -> None:
        """Write the run's files into an existing, private ``folder`` (no swap, no lock)."""
        from simulator.report.run_folder import write_outputs

        write_outputs(folder, self.scenario, self.plan.deployment, list(self.runs.values()), plots=plots,
                      deployments=self.plan.deployments, num_replicas=self.num_replicas, pools=self.pools,
                      sent=self.sent)

    @staticmethod
    def _request_columns() -> tuple[str, ...]:
        from simulator.engine.metrics import REQUEST_COLUMNS

        return REQUEST_COLUMNS


__all__ = ["FLAG_KEYS", "KVShares", "Latency", "Plan", "Result", "RunSummary", "Workload", "dotted_overrides", "load",
           "run", "simulate", "workload"]
