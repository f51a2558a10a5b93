"""``kvplan export``: the commands that reproduce a simulated plan on real GPUs
(:mod:`simulator.commands.export.cmd`), every flag checked against the tools' own option names
(:mod:`simulator.commands.export.flags`)."""
