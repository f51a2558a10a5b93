"""Same input, same requests: fingerprints of the requests built from the bundled traces and from
seeded synthetic specs, recorded before trace reading became streaming and request building
chunked. Users compare runs across kvplan versions, so a change here must be deliberate.

A fingerprint hashes every field of every request, floats by ``repr`` (which round-trips
exactly, so one ulp of difference changes it, and so does a numpy scalar in place of a
``float``). The synthetic ones also depend on numpy's random streams (``default_rng``); a numpy
release that changed one would show up here first.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from workloads.loaders import bundled_trace_path, load_trace
from workloads.request import Request
from workloads.spec import build_requests, parse_workload


def fingerprint(requests: Iterable[Request]) -> str:
    digest = hashlib.sha256()
    for r in requests:
        digest.update(repr((r.request_id, r.arrival_s, r.prompt_tokens, r.output_tokens, r.n,
                            r.beam_width, r.prefix_ids, r.prefix_block_tokens)).encode())
        digest.update(b"\n")
    return digest.hexdigest()[:16]


TRACE_SHAPES: dict[str, dict[str, Any]] = {
    "whole": {},
    "first-1000": {"num_requests": 1000},
    "rate-8-first-500": {"rate": 8.0, "num_requests": 500},
    "rate-2": {"rate": 2.0},
    "scale-2-window": {"rate_scale": 2.0, "start_s": 100, "duration_s": 300},
    "rate-3-window-100": {"rate": 3.0, "start_s": 50, "duration_s": 200, "num_requests": 100},
    "closed-loop": {"concurrency": 4, "num_requests": 50, "start_s": 30},
    "burst": {"rate": float("inf"), "start_s": 10, "num_requests": 20},
    "samples-beams": {"n": 2, "beam_width": 3, "num_requests": 300, "start_s": 5.5},
}
TRACE_FINGERPRINTS = {
    "azure-conv": {
        "whole": "a3e3020bb8c58fdc", "first-1000": "8b0120fd867b745f",
        "rate-8-first-500": "b60709ef1121208f", "rate-2": "a784f7abadd81fd7",
        "scale-2-window": "4b184767788b5668", "rate-3-window-100": "fccf0ff3fa586ed0",
        "closed-loop": "af06573b6d9aaca1", "burst": "5d2a3d3e2a1e5f3b",
        "samples-beams": "488da4277e134605",
    },
    "azure-code": {
        "whole": "70a73d81ef4b7d02", "first-1000": "ca58246887f40ea9",
        "rate-8-first-500": "07bab4304bda8628", "rate-2": "2737002877cdf0c1",
        "scale-2-window": "c6add31b82e7d0d1", "rate-3-window-100": "7b261703ce7444d0",
        "closed-loop": "7553d38ef6377a5a", "burst": "f9c30160b5bac92e",
        "samples-beams": "2a8d170d9b99f3f6",
    },
    "mooncake": {
        "whole": "b98d112af2801b84", "first-1000": "77d1fe573185ee52",
        "rate-8-first-500": "fff1eb578950b55c", "rate-2": "26d0d81d3cec1029",
        "scale-2-window": "a5f157eb522c4b61", "rate-3-window-100": "ac6c82c744a5f853",
        "closed-loop": "0858f642f0668f2e", "burst": "f4cc8d9af99ea99a",
        "samples-beams": "cab6232955df666f",
    },
}

SYNTHETIC_SPECS: dict[str, dict[str, Any]] = {
    "poisson-lognormal": {
        "num_requests": 2000, "arrival": {"process": "poisson", "rate": 5.0},
        "prompt_tokens": {"dist": "lognormal", "mean": 161, "p99": 1024, "max": 2048},
        "output_tokens": {"dist": "lognormal", "mean": 200, "p90": 400},
    },
    "gamma-uniform-zipf": {
        "num_requests": 1500, "arrival": {"process": "gamma", "rate": 9.0, "cv": 2.5},
        "prompt_tokens": {"dist": "uniform", "low": 10, "high": 900},
        "output_tokens": {"dist": "fixed", "value": 77},
        "shared_prefix": {"groups": 7, "prefix_tokens": 300, "popularity": "zipf", "zipf_s": 1.3},
        "n": 2,
    },
    "constant-duration": {
        "duration_s": 120, "arrival": {"process": "constant", "rate": 3.3},
        "prompt_tokens": {"dist": "fixed", "value": 12},
        "output_tokens": {"dist": "uniform", "low": 1, "high": 5},
        "shared_prefix": {"groups": 3, "prefix_tokens": 64, "block_tokens": 16}, "beam_width": 4,
    },
    "poisson-duration-cap": {
        "duration_s": 500, "num_requests": 700, "arrival": {"process": "poisson"}, "rate": 4.0,
        "prompt_tokens": {"dist": "empirical", "trace": "bundled:azure-code", "max": 3000},
        "output_tokens": {"dist": "empirical", "trace": "bundled:mooncake", "min": 2},
    },
    "burst": {
        "rate": float("inf"), "num_requests": 400,
        "prompt_tokens": {"dist": "lognormal", "mean": 500, "p50": 300},
        "output_tokens": {"dist": "fixed", "value": 5},
    },
    "closed-loop": {
        "concurrency": 8, "requests_per_client": 25,
        "prompt_tokens": {"dist": "uniform", "low": 1, "high": 4096},
        "output_tokens": {"dist": "lognormal", "mean": 100, "p95": 300},
    },
}
SYNTHETIC_FINGERPRINTS = {  # spec: {seed: fingerprint}
    "poisson-lognormal": {0: "a9573c6606f5a93c", 1: "effa483c5590a648", 42: "5ae8e40adbcfc14d"},
    "gamma-uniform-zipf": {0: "e0f85082d13804da", 1: "3bbf86957c904e31", 42: "bbe8fa83cbbe03e3"},
    "constant-duration": {0: "2d085388971dc845", 1: "d2186490ffb2cfe2", 42: "1825898715c39619"},
    "poisson-duration-cap": {0: "ceee82f6df53e6fc", 1: "22b04faef1d93a2a", 42: "1a82417b4e6ec261"},
    "burst": {0: "f3a20aad2613719a", 1: "d6a912874fec4c79", 42: "992a3c6fd57ae214"},
    "closed-loop": {0: "79d3e413d6307c3d", 1: "c405e362953e30ee", 42: "67fe1d0d91f0c443"},
}


@pytest.mark.parametrize("name", sorted(TRACE_FINGERPRINTS))
def test_bundled_trace_requests_are_unchanged(name: str) -> None:
    expected = TRACE_FINGERPRINTS[name]
    assert fingerprint(load_trace(bundled_trace_path(name))) == expected["whole"]
    for shape, data in TRACE_SHAPES.items():
        spec = parse_workload({"trace": f"bundled:{name}", **data}, "s.yaml")
        requests = build_requests(spec, seed=0, base_dir=Path("."))
        assert fingerprint(requests) == expected[shape], shape


@pytest.mark.parametrize("name", sorted(SYNTHETIC_FINGERPRINTS))
def test_seeded_synthetic_requests_are_unchanged(name: str) -> None:
    spec = parse_workload(SYNTHETIC_SPECS[name], "s.yaml")
    for seed, expected in SYNTHETIC_FINGERPRINTS[name].items():
        requests = build_requests(spec, seed=seed, base_dir=Path("."))
        assert all(type(r.arrival_s) is float and type(r.prompt_tokens) is int for r in requests)
        assert fingerprint(requests) == expected, seed
