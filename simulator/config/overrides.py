"""Command-line flags as dotted scenario keys (``--rate``, ``--num-requests``, ``--seed``,
``--allocator``, ``--set KEY=VALUE``), the form :func:`simulator.config.scenario.load_scenario`
applies."""

from __future__ import annotations

from simulator.config.scenario import canonical_allocator
from simulator.errors import KvplanError
from simulator.yamlfile import parse_yaml


# A rate override (dotted key) -> the scenario keys it replaces (set to None, i.e. not given).
RATE_KEY_REPLACES: dict[str, tuple[str, ...]] = {
    "workload.rate": ("workload.rate_scale",),
    "workload.rate_scale": ("workload.rate",),
    "workload.arrival.rate": ("workload.rate",),
}


def scenario_overrides(*, rate: float | None = None, num_requests: int | None = None,
                       seed: int | None = None, allocators: list[str] | None = None,
                       extra: list[str] | None = None) -> dict[str, object]:
    """CLI flags as dotted scenario keys (``--set key=value`` values are parsed as YAML scalars).

    A rate given here (``--rate``, ``--set workload.rate=``, ``workload.rate_scale=`` or
    ``workload.arrival.rate=``) replaces the scenario's: the keys it excludes
    (:data:`RATE_KEY_REPLACES`) come back as None unless also given here."""
    out: dict[str, object] = {}
    if rate is not None:
        out["workload.rate"] = rate
    if num_requests is not None:
        out["workload.num_requests"] = num_requests
    if seed is not None:
        out["seed"] = seed
    if allocators:
        out["allocators"] = [canonical_allocator(a) for a in allocators]
    for item in extra or ():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise KvplanError(f"--set expects KEY=VALUE, got '{item}'")
        out[key.strip()] = parse_yaml(value, f"--set {key.strip()}", lines=False)  # a YAML scalar, or a bounded list
    # The file's way of setting the rate gives way to the command line's: left in place, a file's
    # rate_scale beside a CLI rate is refused ("give rate ... or rate_scale ..., not both"), and a file's
    # rate would silently win over a CLI arrival.rate. Keys given on the command line together
    # are the user's own conflict and stay for the scenario check to report.
    cleared = {other for key, others in RATE_KEY_REPLACES.items() if key in out
               for other in others if other not in out}
    for other in sorted(cleared):
        out[other] = None
    return out


__all__ = ["RATE_KEY_REPLACES", "scenario_overrides"]
