"""Incremental detokenisation: per-token deltas add up to the full decode; stop strings cut exactly."""

from __future__ import annotations

import random

import pytest
from checkpoints import WORDS
from transformers import AutoTokenizer

from reference_engine.serving.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer(smollm2_dir):
    return AutoTokenizer.from_pretrained(str(smollm2_dir))


def random_text(rng: random.Random, n: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(n))


def test_deltas_concatenate_to_the_full_decode(tokenizer):
    rng = random.Random()
    for _ in range(20):
        ids = tokenizer.encode(random_text(rng, rng.randint(5, 40)))
        prompt = tokenizer.encode(random_text(rng, 5))
        detok = IncrementalDetokenizer(tokenizer, prompt)
        deltas = []
        for token in ids:
            detok.add(token)
            deltas.append(detok.delta(finished=False))
        deltas.append(detok.delta(finished=True))
        assert "".join(deltas) == tokenizer.decode(ids)
        # A token that ends inside a multi-byte character contributes an empty delta.
        partial = [i for i, t in enumerate(ids) if "\ufffd" in tokenizer.decode([t])]
        assert all(deltas[i] == "" for i in partial if "\ufffd" in tokenizer.decode(ids[: i + 1]))


def test_stop_strings_cut_at_the_first_match_and_never_leak(tokenizer):
    rng = random.Random()
    for _ in range(20):
        text = random_text(rng, 30)
        start = rng.randrange(5, len(text) - 8)
        stop = text[start : start + rng.randint(2, 6)]
        if not stop.strip():
            continue
        ids = tokenizer.encode(text)
        detok = IncrementalDetokenizer(tokenizer, [1], stop=["never-there", stop])
        streamed = ""
        for token in ids:
            detok.add(token)
            streamed += detok.delta(finished=False)
            if detok.stop_string is not None:
                break
        streamed += detok.delta(finished=True)
        assert detok.stop_string == stop
        assert streamed == text[: text.index(stop)]
        with_stop = IncrementalDetokenizer(tokenizer, [1], stop=[stop], include_stop_str_in_output=True)
        for token in ids:
            with_stop.add(token)
        assert with_stop.delta(finished=True) == text[: text.index(stop) + len(stop)]
