"""What a run leaves for a person: results folders that are never corrupted or lost
(:mod:`simulator.report.outputs`), the JSON/CSV writers, the printed tables and SLO verdict,
the plots and the self-contained report.html."""
