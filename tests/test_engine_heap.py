"""The serving processes' garbage-collector set-up: start-up objects frozen, long full collections logged."""

from __future__ import annotations

import gc
import logging

from reference_engine import heap


def test_startup_objects_are_frozen_and_slow_full_collections_logged(monkeypatch, caplog):
    try:
        watch = heap.freeze_startup_heap("test process")
        assert gc.get_freeze_count() > 1000  # this test process's modules, at least
        monkeypatch.setattr(heap, "SLOW_COLLECTION_S", -1.0)  # every full collection counts as slow
        with caplog.at_level(logging.WARNING, logger="reference_engine.heap"):
            gc.collect(1)
            assert not caplog.records  # younger generations are not reported
            gc.collect()
        assert any("test process: a full garbage collection took" in r.getMessage() for r in caplog.records)
    finally:
        gc.callbacks.remove(watch)
        gc.unfreeze()
