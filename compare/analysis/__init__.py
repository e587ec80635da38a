"""Stage 4, analysis: the run directory read back into metrics, statistics, costs, caveats, the parity
audit and the decision, the same way for every backend."""
