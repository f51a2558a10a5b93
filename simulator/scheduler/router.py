"""Multi-replica routing: which data-parallel replica each request is sent to.

The scenario's ``router:`` picks a policy; :class:`Router` applies it to every send
(:func:`simulator.engine.core.simulate`). Each policy is the rule of a real router:

* ``least-outstanding`` (default): fewest requests routed and not finished; SGLang router's
  shortest-queue fallback reads the same router-side count (``worker.load()``).
* ``round-robin``: replica ``k mod N`` for the k-th request routed, rejected ones included
  (sgl-router/src/policies/round_robin.rs ``RoundRobinPolicy.select_worker``: a counter
  ``fetch_add(1) % len``).
* ``vllm-dp``: lowest ``waiting * 4 + running`` (vllm/v1/engine/core_client.py
  ``DPLBAsyncMPClient.get_core_engine_for_request``, commit 364631ab). The front end scans the
  engines from ``eng_start_index`` (0 for a single API server) with a strict ``<``: ties go to
  the lowest index. vLLM main (commit 00080ee) has since replaced the score by
  ``max(client_count * in-flight, waiting + running) + waiting * 6 * max(0, kv_usage - 0.5)``
  and rotates its scan start; kvplan keeps the published 4:1 rule, which reads counters only.
* ``least-kv``: lowest KV-cache utilisation, llm-d's ``kv-cache-utilization-scorer`` alone
  (gateway-api-inference-extension pkg/epp/scheduling/framework/plugins/scorer/
  kvcache_utilization.go ``KVCacheUtilizationScorer.Score``: ``1 - KVCacheUsagePercent``).
  Utilisation is vLLM's ``1 - free blocks / total blocks`` (vllm/v1/core/block_pool.py
  ``BlockPool.get_usage``; evictable cached blocks count as free).
* ``prefix-affinity``: SGLang's cache-aware router (sgl-router/src/policies/cache_aware.rs
  ``CacheAwarePolicy.select_worker``) over a router-side approximate prefix cache. The load
  (router-counted outstanding requests) is *imbalanced* when ``max - min >
  balance_abs_threshold`` and ``max > min * balance_rel_threshold``: then the least loaded
  replica. Otherwise the replica whose cache matches the longest prefix if the match covers
  more than ``cache_threshold`` of the prompt, else the replica with the smallest cache
  (``get_smallest_tenant``). Defaults are the router's command line's (sgl-router/py_src/
  sglang_router/router_args.py ``RouterArgs``: 0.3, 64, 1.5). Either way the prompt's blocks
  are recorded for the chosen replica (``tree.insert``).
* ``precise-prefix``: the replica whose *real* prefix cache holds the most prompt tokens (the
  allocator's ``lookup``), as llm-d's ``precise-prefix-cache-scorer`` reads the engines' KV
  events (llm-d-inference-scheduler pkg/plugins/scorer/precise_prefix_cache.go).
* ``weighted``: llm-d's scheduler: ``Σ weight × score`` over the configured scorers, the highest
  total wins (gateway-api-inference-extension pkg/epp/scheduling/framework/scheduler_profile.go
  ``runScorerPlugins``: ``weightedScorePerPod[pod] += score * weight``). Scorers: ``queue``
  (plugins/queuescorer/queue.go ``QueueScorer.Score``: ``(max - waiting) / (max - min)``, 1 when
  all are equal), ``kv-utilization`` (above) and ``prefix`` (plugins/prefixcachescorer/plugin.go
  ``Plugin.Score``: matched blocks / prompt blocks in the router-side cache).

Ties. llm-d's max-score picker shuffles before sorting ("needed for random tie break when
scores are equal", plugins/picker/max_score_picker.go); kvplan is deterministic instead: a tie
in a policy's own score goes to the fewest outstanding requests for ``least-kv`` and
``precise-prefix`` (so that a burst onto empty replicas spreads as the shuffle would spread it),
then to the lowest index — and straight to the lowest index for every other policy.

The router-side prefix cache (``prefix-affinity`` and the ``prefix`` scorer), as llm-d's
approximate prefix scorer keeps it (plugins/prefixcachescorer/plugin.go: chained block hashes,
an LRU indexer of ``DefaultLRUCapacityPerServer`` = 31250 blocks per server, filled in
``PreRequest`` with what was routed): the prompt is cut into blocks of ``block_tokens``; the
blocks inside the prefix the request names (``prefix_ids``) get chained ids that other requests
sharing the prefix share, the rest ids of their own (text nobody else sends, which still takes
room, as SGLang's tree holds every prompt's characters). Each replica keeps an LRU of at most
``lru_capacity_blocks`` ids. It is the router's own record of what it sent, never the replica's
cache: it can be wrong both ways, as the real approximate routers are.

Staleness (``refresh_interval_s``). 0: the router reads each replica's state at the moment of
the send. T > 0: it reads a *view* refreshed every T seconds of simulated time (at T, 2T, ...,
from 0): what each replica reported at the last refresh — outstanding requests, waiting
requests, running sequences, KV utilisation — plus, for the outstanding and waiting counts,
one per request the router sent to it since (vLLM's front end adds ``client_count`` to the
engine's waiting count on every send between the coordinator's stats updates, every 100 ms by
default). Finishes, admissions and KV changes since the refresh are not seen. The router-side
prefix cache is the router's own and always current; ``precise-prefix`` reads the replicas'
caches live (llm-d keeps its index current from a stream of KV events, not by polling).

Quiet runs. ``least-kv``, ``precise-prefix`` and ``weighted`` with a ``kv-utilization`` weight
read the KV pool or the prefix cache, which change inside a quiet run (block-boundary growths,
evictions) where the engine has not materialised them: with these policies the engine runs one
step at a time (exact, slower; :attr:`RouterConfig.reads_kv`). The other policies read counters
that change only at sends, admissions, preemptions and finishes, never inside a quiet run — a
request sent to a replica during a run is counted as waiting there from its send, as one step
at a time would have queued it — so they keep quiet runs, with identical results.
"""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from simulator.kv.allocator import KVAllocator
from simulator.kv.prefix import block_hashes
from simulator.scheduler import Scheduler
from workloads.request import Request

POLICIES: tuple[str, ...] = ("least-outstanding", "round-robin", "vllm-dp", "least-kv",
                             "prefix-affinity", "precise-prefix", "weighted")
SCORERS: tuple[str, ...] = ("queue", "kv-utilization", "prefix")

# vllm/v1/engine/core_client.py (DPLBAsyncMPClient.get_core_engine_for_request, commit 364631ab):
# score = waiting * 4 + running
VLLM_DP_WAITING_WEIGHT = 4


@dataclass(frozen=True, slots=True)
class RouterConfig:
    """A routing policy and its knobs (the scenario's ``router:``; see the module docstring)."""

    policy: str = "least-outstanding"
    refresh_interval_s: float = 0.0  # 0: exact state at each send
    # weighted: (scorer, weight) pairs; llm-d's example profile weighs prefix 2, the others 1
    scorers: tuple[tuple[str, float], ...] = (("queue", 1.0), ("kv-utilization", 1.0), ("prefix", 2.0))
    # prefix-affinity: sgl-router/py_src/sglang_router/router_args.py (RouterArgs) defaults
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    # router-side prefix cache: vLLM's default block (16 tokens; GIE hashes 64 characters ~ 16
    # tokens), GIE's DefaultLRUCapacityPerServer (prefixcachescorer/plugin.go)
    block_tokens: int = 16
    lru_capacity_blocks: int = 31250

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown routing policy {self.policy!r}")
        if self.refresh_interval_s < 0:
            raise ValueError("refresh_interval_s must be >= 0")
        for name, weight in self.scorers:
            if name not in SCORERS or weight < 0:
                raise ValueError(f"bad scorer {name!r}: {weight}")

    def weight(self, scorer: str) -> float:
        return sum(w for name, w in self.scorers if name == scorer)

    @property
    def reads_kv(self) -> bool:
        """Whether the policy reads KV state that a quiet run leaves unmaterialised (the engine
        then runs one step at a time)."""
        return self.policy in ("least-kv", "precise-prefix") or (
            self.policy == "weighted" and self.weight("kv-utilization") > 0)

    @property
    def uses_router_cache(self) -> bool:
        return self.policy == "prefix-affinity" or (self.policy == "weighted" and self.weight("prefix") > 0)


class ReplicaState(Protocol):
    """What the router reads of a replica (:class:`simulator.engine.core.Replica`)."""

    index: int
    outstanding: int
    scheduler: Scheduler
    allocator: KVAllocator
    held: list  # requests sent during a quiet run, not yet queued
    late: list


@dataclass(frozen=True, slots=True)
class Load:
    """A replica's load as the router sees it."""

    outstanding: int  # requests routed there and not finished
    waiting: int  # requests queued, not running (preempted and swapped out included)
    running: int  # sequences running
    kv_usage: float  # share of the KV pool in use (0..1)


def live_load(rep: ReplicaState) -> Load:
    """The replica's load now. ``waiting`` is the engine's count (waiting + swapped, as its step
    rows report it) plus the requests held back by a quiet run, which one step at a time would
    have queued at their send."""
    sched, alloc = rep.scheduler, rep.allocator
    waiting = len(sched.waiting) + len(sched.swapped) + len(rep.held) + len(rep.late)
    return Load(rep.outstanding, waiting, sched.num_running_seqs, kv_usage(alloc))


def kv_usage(alloc: KVAllocator) -> float:
    """vLLM's KV-cache usage: 1 - free / total (vllm/v1/core/block_pool.py BlockPool.get_usage)."""
    return 1.0 - alloc.num_free_tokens() / alloc.capacity_tokens if alloc.capacity_tokens else 0.0


def cached_prompt_tokens(alloc: KVAllocator, request: Request) -> int:
    """Prompt tokens of ``request`` the replica's prefix cache holds now (what its scheduler would
    find at admission): the radix tree's match for SGLang's pool, the block-hash chain for the
    paged allocator, 0 for an allocator without a prefix cache."""
    if not request.prefix_ids:
        return 0
    # SGLang's pool: its module is loaded wherever one exists, so a run without one never imports it
    radix = sys.modules.get("simulator.kv.radix")
    if radix is not None and isinstance(alloc, radix.RadixTokenPool):
        if not alloc.enable_prefix_caching:
            return 0
        key = radix.token_key(request.prefix_ids, request.prefix_block_tokens, request.prompt_tokens,
                        request.request_id)
        return alloc.tree.peek(key, request.prompt_tokens - 1)[0]
    block_size = getattr(alloc, "block_size", 0)
    if not block_size:
        return 0
    hashes = block_hashes(request.prefix_ids, request.prefix_block_tokens, block_size,
                          request.prompt_tokens)
    return alloc.lookup(hashes, request.prompt_tokens)


class Router:
    """Chooses a replica for each request (:meth:`route`), then is told of the choice
    (:meth:`routed`); :meth:`refresh` takes the stale view (``refresh_interval_s`` > 0).

    Per send the work is O(replicas), plus O(prompt blocks) for the router-side prefix cache."""

    def __init__(self, config: RouterConfig, replicas: Sequence[ReplicaState]) -> None:
        self.config = config
        self.replicas = replicas
        n = len(replicas)
        self._next = 0  # round-robin counter
        self._stale = config.refresh_interval_s > 0
        self._view: list[Load] = [Load(0, 0, 0, 0.0)] * n
        self._sent_since = [0] * n  # requests routed to each replica since the last refresh
        self._caches: list[OrderedDict[int, None]] = [OrderedDict() for _ in range(n)] \
            if config.uses_router_cache else []
        self._choose = getattr(self, "_" + config.policy.replace("-", "_"))

    # --- what the router sees ----------------------------------------------------------------
    def refresh(self) -> None:
        """Take every replica's state as its new report (a stale view's refresh)."""
        self._view = [live_load(rep) for rep in self.replicas]
        self._sent_since = [0] * len(self.replicas)

    def load(self, i: int) -> Load:
        """Replica ``i``'s load as the router sees it now (module docstring, "Staleness")."""
        if not self._stale:
            return live_load(self.replicas[i])
        seen, sent = self._view[i], self._sent_since[i]
        return Load(seen.outstanding + sent, seen.waiting + sent, seen.running, seen.kv_usage)

    def outstanding(self, i: int) -> int:
        if not self._stale:
            return self.replicas[i].outstanding
        return self._view[i].outstanding + self._sent_since[i]

    # --- the decision ------------------------------------------------------------------------
    def route(self, request: Request) -> int:
        """The index of the replica ``request`` goes to. Call :meth:`routed` after sending it."""
        return self._choose(request)

    def routed(self, i: int, request: Request) -> None:
        """Record that ``request`` was sent to replica ``i``."""
        if self._stale:
            self._sent_since[i] += 1
        if self._caches:
            self._insert(i, self._prompt_blocks(request))

    def _least_outstanding(self, request: Request) -> int:
        if not self._stale:  # today's rule, as it always read: min() keeps the lowest index
            return min(self.replicas, key=lambda x: x.outstanding).index
        return min(range(len(self.replicas)), key=self.outstanding)

    def _round_robin(self, request: Request) -> int:
        i = self._next % len(self.replicas)
        self._next += 1
        return i

    def _vllm_dp(self, request: Request) -> int:
        def score(i: int) -> int:
            load = self.load(i)
            return load.waiting * VLLM_DP_WAITING_WEIGHT + load.running
        return min(range(len(self.replicas)), key=score)

    def _least_kv(self, request: Request) -> int:
        return min(range(len(self.replicas)), key=lambda i: (self.load(i).kv_usage, self.outstanding(i)))

    def _precise_prefix(self, request: Request) -> int:
        return min(range(len(self.replicas)), key=lambda i: (
            -cached_prompt_tokens(self.replicas[i].allocator, request), self.outstanding(i)))

    def _prefix_affinity(self, request: Request) -> int:
        cfg = self.config
        n = len(self.replicas)
        loads = [self.outstanding(i) for i in range(n)]
        low, high = min(loads), max(loads)
        if high - low > cfg.balance_abs_threshold and high > low * cfg.balance_rel_threshold:
            return loads.index(low)  # imbalanced: shortest queue
        blocks = self._prompt_blocks(request)
        matched = [self._matched_blocks(i, blocks) for i in range(n)]
        best = max(matched)
        if request.prompt_tokens and best * cfg.block_tokens / request.prompt_tokens > cfg.cache_threshold:
            return matched.index(best)
        sizes = [len(cache) for cache in self._caches]
        return sizes.index(min(sizes))  # the smallest cache: the most room

    def _weighted(self, request: Request) -> int:
        cfg = self.config
        n = len(self.replicas)
        loads = [self.load(i) for i in range(n)]
        totals = [0.0] * n
        w_queue, w_kv, w_prefix = cfg.weight("queue"), cfg.weight("kv-utilization"), cfg.weight("prefix")
        if w_queue:
            waiting = [load.waiting for load in loads]
            low, high = min(waiting), max(waiting)
            for i in range(n):
                totals[i] += w_queue * (1.0 if high == low else (high - waiting[i]) / (high - low))
        if w_kv:
            for i in range(n):
                totals[i] += w_kv * (1.0 - loads[i].kv_usage)
        if w_prefix:
            blocks = self._prompt_blocks(request)
            if blocks:
                for i in range(n):
                    totals[i] += w_prefix * self._matched_blocks(i, blocks) / len(blocks)
        return totals.index(max(totals))

    # --- the router-side prefix cache --------------------------------------------------------
    def _prompt_blocks(self, request: Request) -> tuple[int, ...]:
        """The ids of the prompt's full blocks of ``block_tokens``: chained over the named prefix,
        then the request's own (module docstring)."""
        bt = self.config.block_tokens
        shared = block_hashes(request.prefix_ids, request.prefix_block_tokens, bt, request.prompt_tokens)
        own = request.prompt_tokens // bt - len(shared)
        if own <= 0:
            return shared
        return shared + tuple(hash((-1, request.request_id, j)) for j in range(own))

    def _matched_blocks(self, i: int, blocks: Sequence[int]) -> int:
        """Leading blocks of ``blocks`` in replica ``i``'s router-side cache."""
        cache = self._caches[i]
        k = 0
        for b in blocks:
            if b not in cache:
                break
            k += 1
        return k

    def _insert(self, i: int, blocks: Sequence[int]) -> None:
        """Record ``blocks`` as the most recently used of replica ``i``, evicting the least recently
        used beyond ``lru_capacity_blocks``."""
        cache = self._caches[i]
        for b in blocks:
            if b in cache:
                cache.move_to_end(b)
            else:
                cache[b] = None
        while len(cache) > self.config.lru_capacity_blocks:
            cache.popitem(last=False)


def requests_per_replica(replica_of_request: Sequence[int], num_replicas: int) -> list[int]:
    """How many requests each replica was sent (``SimResult.times.replica`` per request; -1,
    never sent, is not counted)."""
    counts = [0] * num_replicas
    for i in replica_of_request:
        if i >= 0:
            counts[i] += 1
    return counts


__all__ = ["POLICIES", "SCORERS", "Load", "Router", "RouterConfig", "cached_prompt_tokens",
           "kv_usage", "live_load", "requests_per_replica"]
