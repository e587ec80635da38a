"""The serving processes' set-up: start-up objects frozen, long full collections logged; the event loop."""

from __future__ import annotations

import gc
import logging

import pytest

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


@pytest.mark.parametrize("kind", ["auto", "asyncio"])
def test_front_end_event_loop(kind):
    """The server runs on uvloop where installed (a project dependency), or on asyncio's loop if asked."""
    import asyncio

    from reference_engine.serving.server import run_on_loop

    async def loop_module() -> int:
        await asyncio.sleep(0)
        return 1 if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else 0

    assert run_on_loop(loop_module(), kind) == (1 if kind == "auto" else 0)


def test_tokenizer_is_loaded_early_only_from_a_directory_the_command_line_names(tmp_path):
    """The front end loads a local checkpoint's tokenizer while the engine core starts; a built-in or random
    model is resolved by the core, so its tokenizer waits (and a later check sends the early one back if the
    core settled elsewhere)."""
    from reference_engine.serving.options import parse_args
    from reference_engine.serving.server import early_tokenizer_source, same_place

    assert early_tokenizer_source(parse_args(["--model", "random:tiny"])) is None
    assert early_tokenizer_source(parse_args(["--model", "smollm2-135m"])) is None
    assert early_tokenizer_source(parse_args(["--model", str(tmp_path)])) == str(tmp_path)
    other = tmp_path / "tok"
    other.mkdir()
    given = parse_args(["--model", "random:tiny", "--tokenizer", str(other)])
    assert early_tokenizer_source(given) == str(other)
    assert same_place(str(tmp_path), f"{tmp_path}/") and not same_place(str(tmp_path), str(other))
    assert not same_place(str(tmp_path), None)


def test_the_front_end_imports_no_torch():
    """A front end never runs a model: importing its modules must not import torch (seconds of start-up in
    each front-end process; the tokenizer's load, through AutoTokenizer, still does, beside the engine core's
    start). In a fresh interpreter, as a front end starts."""
    import subprocess
    import sys

    probe = ("import sys\n"
             "import reference_engine.serving.server, reference_engine.serving.frontends\n"
             "import reference_engine.serving.engine_client, reference_engine.serving.options\n"
             "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'torch')[:5])\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
