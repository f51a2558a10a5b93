"""``kvplan capacity``: the maximum request rate a deployment sustains under an SLO.

``search`` finds one (point, allocator, seed)'s threshold — a rate, or a number of closed-loop
clients — by bracketing and bisection, starting from ``bound``'s analytic ceiling on the rate and
stopping each probe once ``stop`` finds its SLO certainly broken; ``pareto`` turns the
throughput-latency curve over concurrency into tokens/s per GPU and per user with its Pareto
frontier; ``sweep`` turns a scenario's ``sweep:`` section into points and folds searches into
table rows; ``executors`` runs searches in a process pool or on Ray; ``plots`` draws them;
``options`` is the command's parser (light: the CLI imports it for every command) and ``cmd``
runs it.

``--target-rate`` asks the inverse question, how many replicas hold a given rate: ``replicas``
searches the fewest (from ``bound``'s ceiling, on the same probes and cache), ``replica_table``
folds them into rows with GPUs and cost, ``replica_plots`` draws them and ``replica_cmd`` runs it.
"""
