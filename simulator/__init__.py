"""kvplan's serving model: KV sizing and allocators, the scheduler, latency models and the SimPy engine.

Everything under ``simulator.kv`` and the scheduler is pure Python: no time, no SimPy, no torch.
"""
