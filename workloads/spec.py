"""Re-exports `RequestSpec` from its home, `adapters/request_spec.py`, for workloads/loadgen.py and
workloads/distributed.py until they import it from there."""

from adapters.request_spec import RequestSpec

__all__ = ["RequestSpec"]
