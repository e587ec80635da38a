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


def test_the_front_end_imports_no_torch(tmp_path):
    """A front end never runs a model: importing its modules and loading a checkpoint's plain tokenizer must
    not import torch (seconds of start-up in each front-end process). In a fresh interpreter, as a front end
    starts."""
    import subprocess
    import sys

    from checkpoints import make_checkpoint

    checkpoint = make_checkpoint(tmp_path / "ckpt", "llama")
    probe = (
        "import sys\n"
        "import reference_engine.serving.server, reference_engine.serving.frontends\n"
        "import reference_engine.serving.engine_client, reference_engine.serving.options\n"
        "from reference_engine.tokenizer import checkpoint_tokenizer\n"
        "checkpoint_tokenizer(sys.argv[1]).decode([5, 6, 7])\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'torch')[:5])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, str(checkpoint)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def _declare(folder, tokenizer_class: str, **extra) -> None:
    import json

    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(tokenizer_class=tokenizer_class, **extra)
    path.write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("family", "declared", "plain"),
    [
        ("llama", "PreTrainedTokenizerFast", True),
        ("qwen2", "PreTrainedTokenizerFast", False),
        ("llama", "TokenizersBackend", True),
        (None, "PreTrainedTokenizerFast", True),  # a tokenizer folder without a model config
        ("mistral", "PreTrainedTokenizerFast", False),
        ("llama", "LlamaTokenizerFast", False),
        ("llama", "GPT2Tokenizer", False),
    ],
)
def test_a_plain_tokenizer_loaded_directly_is_the_one_autotokenizer_loads(tmp_path, family, declared, plain):
    """`checkpoint_tokenizer` skips AutoTokenizer for a plain tokenizers-library tokenizer
    (`plain_fast_tokenizer`); it must be the class AutoTokenizer picks and encode, decode and template alike.
    Other declarations go through AutoTokenizer, as before."""
    import random
    import string

    from checkpoints import make_checkpoint, make_tokenizer
    from transformers import AutoTokenizer

    from reference_engine.tokenizer import checkpoint_tokenizer, plain_fast_tokenizer

    if family is None:
        make_tokenizer(tmp_path)
        folder = tmp_path
    else:
        folder = make_checkpoint(tmp_path / family, family)
    _declare(folder, declared)
    assert plain_fast_tokenizer(str(folder)) is plain
    ours, auto = checkpoint_tokenizer(str(folder)), AutoTokenizer.from_pretrained(str(folder))
    assert type(ours) is type(auto)
    rng = random.Random()
    alphabet = string.ascii_letters + string.digits + " .,;\n" + "éßжあ🙂"
    for _ in range(20):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 80)))
        assert ours(text).input_ids == auto(text).input_ids
        ids = [rng.randrange(len(auto)) for _ in range(rng.randrange(1, 40))]
        assert ours.decode(ids) == auto.decode(ids)
        assert ours.convert_ids_to_tokens(ids) == auto.convert_ids_to_tokens(ids)
    assert ours.all_special_tokens == auto.all_special_tokens and ours.eos_token_id == auto.eos_token_id
    assert ours.bos_token_id == auto.bos_token_id
    messages = [{"role": "user", "content": "hi"}]
    assert ours.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True
    ) == auto.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


def test_a_tokenizer_with_code_of_its_own_goes_through_autotokenizer(tmp_path):
    from checkpoints import make_tokenizer

    from reference_engine.tokenizer import plain_fast_tokenizer

    make_tokenizer(tmp_path)
    _declare(tmp_path, "PreTrainedTokenizerFast", auto_map={"AutoTokenizer": [None, "tok.MyTokenizer"]})
    assert not plain_fast_tokenizer(str(tmp_path))
    (tmp_path / "tokenizer.json").unlink()
    _declare(tmp_path, "PreTrainedTokenizerFast")
    assert not plain_fast_tokenizer(str(tmp_path))  # no tokenizers-library file
    assert not plain_fast_tokenizer(str(tmp_path / "absent"))
