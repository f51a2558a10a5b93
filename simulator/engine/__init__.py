"""The discrete-event engine: SimPy replicas driving the scheduler's StepPlans
(:mod:`simulator.engine.core`), the step log, disaggregated prefill/decode pools, one
allocator's run of a workload (:mod:`simulator.engine.runs`) and its measurements
(:mod:`simulator.engine.metrics`, the saturation test)."""
