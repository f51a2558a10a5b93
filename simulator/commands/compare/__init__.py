"""Closing the loop: a plan against what was measured, and two plans against each other.

``kvplan compare`` (:mod:`.cmd`) reads a benchmark's result (:mod:`.results`), simulates the
scenario at the load it was measured at (:mod:`.against`), predicts the same metrics by the
measuring tool's own definitions (:mod:`.predict`) and reports the errors (:mod:`.measured`); or
puts two ``simulate`` folders side by side (:mod:`.runs`). ``kvplan calibrate --from-results``
(:mod:`.calibrate`) fits the roofline's constants to such results.
"""
