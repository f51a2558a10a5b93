"""``kvplan validate``: the roofline held against published GPU measurements.

``table`` reads ``validation/published.csv``; ``setups`` turns its rows into scenarios;
``predict`` simulates them (and records runs for re-timing); ``fit`` fits the roofline's
constants and leaves one source out; ``report`` prints, writes and plots; ``cmd`` is the command.
"""
