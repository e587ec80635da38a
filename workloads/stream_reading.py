"""Re-exports `workloads/response_parsing.py` under its old name for workloads/loadgen.py, until it
imports it."""

from workloads.response_parsing import SLICE_S, StreamReading, reading_steps, run_to_end

__all__ = ["SLICE_S", "StreamReading", "reading_steps", "run_to_end"]
