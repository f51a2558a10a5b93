"""kvplan's serving model: KV sizing and allocators, the scheduler, latency models and the SimPy engine.

Everything under ``simulator.kv`` and the scheduler is pure Python: no time, no SimPy, no torch.
The per-step modules may also run compiled from the same source (:mod:`simulator.compiled`).
"""

from simulator import compiled as _compiled

_compiled.install()  # before any hot module is imported: a stale compiled build runs from source
