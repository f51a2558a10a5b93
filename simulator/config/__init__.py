"""Scenario YAML -> a validated :class:`~simulator.config.scenario.Scenario` -> a resolved
:class:`~simulator.config.deployment.Deployment` (allocators, latency model, scheduler knobs),
and what vLLM would refuse to start (:mod:`simulator.config.refusals`)."""
