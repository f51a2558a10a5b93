"""What a measurement is compared against: a scenario simulated at the measured load, or a run.

:func:`scenario_at_load` rewrites a scenario's ``workload:`` so that it sends requests the way
the benchmark did, and says what it inferred:

* vLLM's ``request_rate`` R with ``burstiness`` b (vllm/benchmarks/serve.py ``get_request``:
  gaps drawn from a gamma distribution of shape b and mean 1/R; b = 1 is Poisson) becomes
  ``rate: R`` with ``arrival: {process: gamma, cv: 1/√b}`` (a gamma's coefficient of variation
  is 1/√shape) or ``poisson``; ``"inf"`` becomes ``rate: inf`` (every request at t = 0);
  ``max_concurrency`` caps requests in flight (``max_concurrency``). A trace keeps its own
  arrival pattern, rescaled to R.
* GuideLLM's ``concurrent`` (N streams) and ``synchronous`` (one) are closed loops
  (``concurrency``); ``throughput`` is a burst; ``constant``/``poisson`` are rates.
* The number of requests sent becomes ``num_requests``; a synthetic workload gets fixed prompt
  and output lengths at the result's means (total tokens / completed requests: the result keeps
  no distribution); a trace keeps its own lengths.
* Warm-up is dropped: vLLM's ``--num-warmups`` and GuideLLM's warm-up run outside the numbers
  the result reports, on a server then idle again.
"""

from __future__ import annotations

import copy
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.commands.compare.results import Load, MeasuredResult
from simulator.errors import KvplanError, warn_user
from simulator.yamlfile import read_yaml

# The most requests one result is simulated with unless --max-requests says otherwise. A result
# states how many requests its benchmark sent and kvplan builds them all before it simulates.
# Real runs are far smaller (vllm bench serve sends --num-prompts, default 1000:
# vllm/benchmarks/serve.py's usage text); 200,000 requests of the example scenario
# (Llama-3.1-8B on an H100, 512/128 tokens) took 197 s and 2.1 GB at 4 req/s, and 79 s and
# 0.3 GB as a burst, on a 2-core machine: 100,000 is a minute or two, and a file claiming 10^9
# would ask for terabytes.
DEFAULT_MAX_REQUESTS = 100_000

# Keys of ``workload:`` that say how requests are sent: all replaced by the result's load.
_SENDING_KEYS = ("rate", "rate_scale", "arrival", "concurrency", "requests_per_client", "think_time_s",
                 "max_concurrency", "warmup_requests", "warmup_fraction")


def read_scenario_mapping(path: str) -> dict[str, Any]:
    """The scenario file's mapping as written (its ``name`` defaulting to the file's stem)."""
    data = read_yaml(Path(path), "scenario")
    if not isinstance(data, dict):
        raise KvplanError(f"{path}: a scenario is a mapping of keys (model, gpu, workload, ...)")
    data.setdefault("name", Path(path).stem)
    return data


def scenario_at_load(data: dict[str, Any], load: Load, where: str) -> tuple[dict[str, Any], list[str]]:
    """``data`` (a scenario mapping) with its workload sent at ``load``, and what was inferred
    (module docstring). A load that records nothing leaves the workload as it is."""
    out = copy.deepcopy(data)
    workload = dict(out.get("workload") or {})
    notes: list[str] = []
    trace = workload.get("trace") is not None
    recorded = load.rate is not None or load.concurrency is not None
    if recorded:
        for key in _SENDING_KEYS:
            workload.pop(key, None)
        notes.append("warm-up: none (the tools measure after their warm-up, on an idle server)")
    if load.concurrency is not None:
        workload["concurrency"] = load.concurrency
    elif load.rate is not None:
        workload["rate"] = load.rate
        if not math.isinf(load.rate):
            if trace:
                if load.arrival not in (None, "poisson"):
                    notes.append(f"arrivals: the trace's own, rescaled to {load.rate:g} req/s "
                                 f"(the benchmark's {load.arrival} arrivals are not replayed)")
            else:
                workload["arrival"] = _arrival(load)
    if load.max_concurrency is not None:
        workload["max_concurrency"] = load.max_concurrency
    if load.num_requests is not None:
        workload["num_requests"] = load.num_requests
        workload.pop("duration_s", None)
    elif recorded and workload.get("num_requests") is None and (load.concurrency or _burst(load)) \
            and workload.get("requests_per_client") is None:
        raise KvplanError(f"{where}: the result does not record how many requests were sent, and the "
                          "scenario's workload has no num_requests")
    if load.mean_prompt_tokens is not None and load.mean_output_tokens is not None:
        if trace:
            notes.append("lengths: the trace's own (the result records only their means: "
                         f"{load.mean_prompt_tokens:.0f}/{load.mean_output_tokens:.0f} tokens)")
        else:
            prompt, output = round(load.mean_prompt_tokens), round(load.mean_output_tokens)
            workload["prompt_tokens"] = {"dist": "fixed", "value": max(1, prompt)}
            workload["output_tokens"] = {"dist": "fixed", "value": max(1, output)}
            notes.append(f"lengths: fixed at the result's means, {prompt} prompt / {output} output tokens "
                         "(total tokens / completed requests)")
    out["workload"] = workload
    return out, notes


def check_request_cap(result: MeasuredResult, data: dict[str, Any], scenario_path: str, max_requests: int,
                      *, flag: str) -> None:
    """Refuse, before any request is built, a simulation of more than ``max_requests`` requests
    that the result asks for: its own count (vLLM's ``num_prompts``, GuideLLM's request total),
    or its rate over the scenario's ``duration_s``. ``data``: the scenario at the result's load
    (:func:`scenario_at_load`); ``flag``: the option that lifts the cap."""
    load, workload = result.load, data.get("workload") or {}
    lift = f"{flag} N simulates more"
    if load.num_requests is not None:
        if load.num_requests > max_requests:
            raise KvplanError(f"{result.path}: '{result.field_of('num_requests')}' is {load.num_requests:,}: "
                              f"more requests than kvplan simulates for one result (at most {max_requests:,}; "
                              f"{lift})")
        return
    duration = workload.get("duration_s")
    if (load.rate is not None and math.isfinite(load.rate) and workload.get("num_requests") is None
            and isinstance(duration, (int, float)) and load.rate * duration > max_requests):
        raise KvplanError(f"{result.path}: '{result.field_of('rate')}' {load.rate:g} req/s over "
                          f"{scenario_path}'s workload.duration_s {duration:g} s is {load.rate * duration:,.0f} "
                          f"requests: more than kvplan simulates for one result (at most {max_requests:,}; {lift})")


def _burst(load: Load) -> bool:
    return load.rate is not None and math.isinf(load.rate)


def _arrival(load: Load) -> dict[str, Any]:
    if load.arrival == "gamma" and load.burstiness:
        return {"process": "gamma", "cv": 1.0 / math.sqrt(load.burstiness)}
    return {"process": load.arrival or "poisson"}


def check_model(result: MeasuredResult, simulated_model: str) -> None:
    """A result measured on another model than the one simulated is an error; a model id the
    catalog does not know is a warning (it cannot be checked)."""
    if not result.model:
        return
    from simulator.commands.validate.setups import resolve_model

    try:
        measured = resolve_model(result.model)
    except KvplanError:
        warn_user(f"{result.path}: model '{result.model}' is not in the catalog: cannot check that it "
                  f"is {simulated_model}")
        return
    if measured.lower() != simulated_model.lower():
        raise KvplanError(f"{result.path}: measured on {result.model} ({measured}); the simulation "
                          f"runs {simulated_model}")


@dataclass(frozen=True)
class RunFolder:
    """A ``simulate`` output folder: its summary per allocator (or engine/allocator), its run
    metadata, and where its CSVs are."""

    path: Path
    summary: dict[str, Any]
    run: dict[str, Any]

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def model(self) -> str:
        return str(self.run.get("deployment", {}).get("model", "?"))

    def pick(self, allocator: str | None) -> str:
        """The summary key to compare: ``allocator``, else ``paged`` when run, else the first."""
        keys = list(self.summary)
        if allocator is not None:
            matches = [k for k in keys if k == allocator or k.rsplit("/", 1)[-1] == allocator]
            if len(matches) != 1:
                raise KvplanError(f"{self.path}: no single run '{allocator}' (it has {', '.join(keys)})")
            return matches[0]
        return next((k for k in keys if k.rsplit("/", 1)[-1] == "paged"), keys[0])


def read_run(path: str) -> RunFolder:
    """The ``simulate`` folder at ``path`` (summary.json, run.json, requests.csv, steps.csv)."""
    p = Path(path)
    if not p.is_dir():
        raise KvplanError(f"{path}: not a folder of simulate results")
    for name in ("summary.json", "run.json", "requests.csv", "steps.csv"):
        if not (p / name).is_file():
            raise KvplanError(f"{path}: no {name} (not a folder `simulate` wrote)")
    try:
        summary = json.loads((p / "summary.json").read_text(encoding="utf-8"))
        run = json.loads((p / "run.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise KvplanError(f"{path}: cannot read its summary.json/run.json ({err})") from None
    if not isinstance(summary, dict) or not summary:
        raise KvplanError(f"{path}/summary.json: no run in it")
    return RunFolder(p, summary, run)
