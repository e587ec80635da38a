"""Stage 3, measure: every backend through every workload and load point, each point's records, summary and
GPU samples appended to the run directory (here, or on Ray)."""
