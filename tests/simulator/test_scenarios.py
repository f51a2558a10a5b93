"""Every shipped scenario loads, builds its deployment, and runs a short prefix of its workload.

A capacity scenario (one with a ``sweep:`` section, for ``kvplan capacity``) is checked through its
base scenario: the file without the sweep. Its top comment says what it gives as shipped, and the
knobs its comments suggest (``--set``, ``--sweep``, ``--rate``) load and build.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simulator.config.deployment import build_deployment
from simulator.engine.disagg import build_pools
from simulator.commands.simulate import run_simulate
from simulator.config.overrides import scenario_overrides
from simulator.config.scenario import load_scenario

SCENARIOS = sorted((Path(__file__).resolve().parents[2] / "scenarios").glob("*.yaml"))
NUM_REQUESTS = 50


def base_scenario(path: Path, tmp_path: Path) -> Path:
    """The scenario itself, or for a capacity scenario a copy without its sweep."""
    data = yaml.safe_load(path.read_text())
    if "sweep" not in data:
        return path
    del data["sweep"]
    trace = data.get("workload", {}).get("trace")
    if trace and not trace.startswith("bundled:") and not Path(trace).is_absolute():
        data["workload"]["trace"] = str(path.parent / trace)  # the copy lives elsewhere
    data.setdefault("name", path.stem)
    copy = tmp_path / path.name
    copy.write_text(yaml.safe_dump(data))
    return copy


def test_there_are_scenarios():
    assert "chat.yaml" in {p.name for p in SCENARIOS}


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_builds_a_deployment(path, tmp_path):
    scenario, base_dir = load_scenario(base_scenario(path, tmp_path))
    if scenario.disaggregation is not None:  # a prefill pool and a decode pool
        deps = list(build_pools(scenario, base_dir))
    else:  # a scenario comparing engines builds one per engine
        deps = [build_deployment(scenario.for_engine(engine), base_dir) for engine in scenario.engines]
    for dep in deps:
        d = dep.describe()
        engine = dep.scheduler_config.engine
        assert d["engine"] == engine
        assert d["num_blocks"] > 0
        # vLLM V1 keeps block 0 as its null block (BlockPool.__init__); the other engines use all
        assert d["usable_blocks"] == d["num_blocks"] - (1 if engine == "vllm-v1" else 0)
        if dep.capacity.kv_groups is None:
            assert d["kv_capacity_tokens"] == d["usable_blocks"] * d["block_size"]
        else:  # a hybrid model's pool: the context it holds at peak (a block id spans one group)
            # max concurrency counts every block, as vLLM's start-up line; the tokens the usable ones
            per_request = d["num_blocks"] / d["max_concurrency_at_max_model_len"]
            assert d["kv_capacity_tokens"] == int(d["usable_blocks"] / round(per_request) * d["max_model_len"])
        assert d["bytes_per_token"] > 0 and d["available_kv_gib"] > 0
        assert d["max_model_len"] >= 2
    assert scenario.allocators and len(set(scenario.allocators)) == len(scenario.allocators)


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_runs_and_accounts_for_every_request(path, tmp_path):
    out, summary = run_simulate(str(base_scenario(path, tmp_path)), out=str(tmp_path / "out"),
                                overrides=scenario_overrides(num_requests=NUM_REQUESTS), quiet=True,
                                plots=False)
    assert list(summary) == list(json.loads((out / "summary.json").read_text()))
    for name, s in summary.items():
        assert s["completed"] + s["rejected"] == NUM_REQUESTS, name
        assert s["completed"] > 0, name
    req = pd.read_csv(out / "requests.csv")
    assert len(req) == NUM_REQUESTS * len(summary)
    assert set(req.status) <= {"finished", "rejected"}
    assert req[req.status == "rejected"].reject_reason.notna().all()
    stories = {
        # the scenario files' comments: what each one is there to show
        "shared-prefix": lambda s: s["paged"]["prefix_hit_rate"] > 0,
        "long-context": lambda s: s["paged"]["prefix_hit_rate"] > 0,
        "beam-search": lambda s: s["paged"]["kv"]["shared_saved"] > 0,
        "parallel-sampling": lambda s: (s["paged"]["kv"]["shared_saved"] > 0
                                        and s["paged"]["kv"]["token_state"]
                                        > s["contiguous-max"]["kv"]["token_state"]),
    }
    if path.stem in stories:
        assert stories[path.stem](summary), path.stem


# Inputs of other commands (`capacity` over a sweep, `fidelity` against a real engine): their
# verdict is what that command writes, not a simulate run as shipped.
NOT_RUN_AS_SHIPPED = {"capacity-chat", "fidelity-cpu", "fidelity-gpu"}
VERDICT = re.compile(r"As shipped\b.{0,120}?\b(meets|misses|saturated|keeps up|overload)", re.S)
FLAG = re.compile(r"--(set|sweep|rate)\s+(\S+)")


def comment_text(path: Path) -> tuple[str, str]:
    """The leading comment block, and every comment line of the file, without their '#'."""
    lines = path.read_text().splitlines()
    strip = [line.strip()[1:].strip() for line in lines if line.strip().startswith("#")]
    lead = []
    for line in lines:
        if not line.strip().startswith("#"):
            break
        lead.append(line.strip()[1:].strip())
    return "\n".join(lead), "\n".join(strip)


def suggested_overrides(text: str) -> list[list[tuple[str, str]]]:
    """The flags of each command a comment suggests: a `...` span (it may wrap lines), or a line
    holding flags outside such spans. A placeholder value (`--rate R`) is not a command."""
    spans = re.findall(r"`([^`]*)`", text)
    spans += [line for line in re.sub(r"`[^`]*`", "", text).splitlines() if FLAG.search(line)]
    groups = []
    for span in spans:
        flags = [(kind, value.rstrip(".,;:)")) for kind, value in FLAG.findall(span)]
        flags = [(k, v) for k, v in flags if not re.fullmatch(r"[A-Z]+", v.partition("=")[2] or v)]
        if flags:
            groups.append(flags)
    return groups


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_comment_says_its_verdict_and_its_knobs_load(path, tmp_path):
    """The top comment says what the scenario gives as shipped (meets its SLO, misses it,
    saturated), and every --set / --sweep / --rate its comments suggest is a knob the scenario
    takes with a value that builds its deployment: a fix they name is one a user can run."""
    lead, comments = comment_text(path)
    if path.stem not in NOT_RUN_AS_SHIPPED:
        assert VERDICT.search(lead), f"{path.name}: the top comment has no 'As shipped ...' verdict"
    base = base_scenario(path, tmp_path)
    for group in suggested_overrides(comments):
        extra = [v for k, v in group if k == "set"]
        rate = next((float(v) for k, v in group if k == "rate"), None)
        sweeps = [v.partition("=") for k, v in group if k == "sweep"]
        points = [[]] + [[f"{key}={value}"] for key, _, values in sweeps for value in values.split(",")]
        for point in points:
            scenario, base_dir = load_scenario(base, scenario_overrides(rate=rate, extra=extra + point))
            if scenario.disaggregation is not None:
                assert list(build_pools(scenario, base_dir)), (path.name, group)
            else:
                for engine in scenario.engines:
                    dep = build_deployment(scenario.for_engine(engine), base_dir)
                    assert dep.describe()["num_blocks"] > 0, (path.name, group)
