"""The `compare` CLI, launchers, metrics and normalisation maths, the results store and reports."""
