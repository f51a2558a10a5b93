"""``kvplan capacity``: the maximum request rate a deployment sustains under an SLO.

``search`` finds one (point, allocator, seed)'s threshold by bracketing and bisection;
``sweep`` turns a scenario's ``sweep:`` section into points and folds searches into table rows;
``executors`` runs searches in a process pool or on Ray; ``plots`` draws them; ``cmd`` is the CLI.
"""
