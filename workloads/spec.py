"""Re-exports `RequestSpec` from its home, `adapters/request_spec.py`, for the modules not yet switched
(workloads/loadgen.py, workloads/distributed.py, benchmarks/)."""

from adapters.request_spec import RequestSpec

__all__ = ["RequestSpec"]
