"""Re-exports `workloads/body_capture.py` under its old name for workloads/loadgen.py, until it imports it."""

from workloads.body_capture import StampingConnector, StampingHandler, read_stamped

__all__ = ["StampingConnector", "StampingHandler", "read_stamped"]
