"""Datasets: token-exact prompts (checked through the tokenizer), length distributions, files, prefixes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from checkpoints import make_tokenizer
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from workloads.datasets import (
    LengthDist,
    fixed_dataset,
    jsonl_dataset,
    make_dataset,
    prefix_dataset,
    random_dataset,
    sharegpt_dataset,
    token_exact_prompt,
)

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    """A byte-level BPE tokenizer trained here on multilingual text (merges, multi-byte characters)."""
    return make_tokenizer(tmp_path_factory.mktemp("bpe"))


@pytest.fixture(scope="module")
def words():
    """A word-level tokenizer: every id is one whitespace-separated word."""
    vocab = {f"w{i}": i for i in range(500)} | {"<unk>": 500}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>")


def assert_token_exact(tokenizer, specs):
    for spec in specs:
        encoded = tokenizer.encode(spec.prompt_text, add_special_tokens=False)
        assert encoded == list(spec.prompt_token_ids), spec
        assert not set(spec.prompt_token_ids) & set(tokenizer.all_special_ids)


@pytest.mark.parametrize("name", ["bpe", "words"])
def test_random_prompts_are_token_exact(name, request):
    tokenizer = request.getfixturevalue(name)
    specs = random_dataset(tokenizer, 40, "uniform:1:300", "lognormal:100:0.6", seed=21)
    assert_token_exact(tokenizer, specs)
    rng = np.random.default_rng(21)
    wanted_in = LengthDist.parse("uniform:1:300").sample(rng, 40)
    assert [s.prompt_len for s in specs] == wanted_in.tolist()
    assert len({s.request_id for s in specs}) == 40


def test_same_seed_same_prompts_other_seed_other_prompts(bpe):
    a = random_dataset(bpe, 5, 64, 16, seed=3)
    assert a == random_dataset(bpe, 5, 64, 16, seed=3)
    other = random_dataset(bpe, 5, 64, 16, seed=4)
    assert [s.prompt_token_ids for s in a] != [s.prompt_token_ids for s in other]


def test_fixed_scenario(bpe):
    specs = fixed_dataset(bpe, 6, seed=8)
    assert {(s.prompt_len, s.wanted_output_tokens) for s in specs} == {(512, 128)}
    assert_token_exact(bpe, specs)


def test_length_distributions():
    rng = np.random.default_rng(9)
    assert LengthDist.parse("fixed:7").sample(rng, 100).tolist() == [7] * 100
    assert LengthDist.parse(7) == LengthDist.parse("7") == LengthDist("fixed", 7)
    u = LengthDist.parse("uniform:10:20").sample(rng, 20_000)
    assert u.min() == 10 and u.max() == 20 and abs(u.mean() - 15) < 0.1
    n = LengthDist.parse("normal:300:40").sample(rng, 20_000)
    assert abs(n.mean() - 300) < 1.5 and abs(n.std() - 40) < 1.5
    ln = LengthDist.parse("lognormal:200:0.5").sample(rng, 20_000)
    assert abs(np.median(ln) - 200) < 4 and ln.min() >= 1
    clipped = LengthDist.parse("normal:2:10").sample(rng, 1000)
    assert clipped.min() == 1  # never below one token
    for bad in ["uniform:5", "gauss:1:2", "uniform:9:3", "normal:5:-1", "x", "fixed:0"]:
        with pytest.raises(ValueError):
            LengthDist.parse(bad)


def test_token_exact_prompt_refuses_zero_tokens(bpe):
    with pytest.raises(ValueError, match="at least one token"):
        token_exact_prompt(bpe, 0, np.random.default_rng(0))


def test_sharegpt_file(bpe, tmp_path):
    specs = sharegpt_dataset(DATA / "sharegpt_small.json", bpe, seed=1)
    by_id = {s.request_id: s for s in specs}
    # conv-c has no question, conv-e is shorter than 4 tokens, the string is not a conversation
    assert set(by_id) == {"sharegpt-conv-a", "sharegpt-conv-b", "sharegpt-conv-d"}
    b = by_id["sharegpt-conv-b"]
    assert b.prompt_text == "Name three sampling parameters."
    assert b.wanted_output_tokens == len(bpe.encode("Temperature, top-p and top-k.",
                                                    add_special_tokens=False))
    assert_token_exact(bpe, specs)
    assert len(sharegpt_dataset(DATA / "sharegpt_small.json", bpe, n=2, seed=1)) == 2
    drawn = sharegpt_dataset(DATA / "sharegpt_small.json", bpe, seed=1, output_len="fixed:33")
    assert {s.wanted_output_tokens for s in drawn} == {33}
    with pytest.raises(FileNotFoundError, match="ShareGPT file not found"):
        sharegpt_dataset(tmp_path / "missing.json", bpe)
    (tmp_path / "obj.json").write_text(json.dumps({"conversations": []}))
    with pytest.raises(ValueError, match="JSON list"):
        sharegpt_dataset(tmp_path / "obj.json", bpe)


def test_jsonl_file(bpe, tmp_path):
    specs = jsonl_dataset(DATA / "prompts.jsonl", bpe, output_tokens=50)
    assert [(s.request_id, s.wanted_output_tokens) for s in specs] == [
        ("jsonl-short", 32), ("jsonl-default-length", 50), ("jsonl-4", 64)]
    assert_token_exact(bpe, specs)
    with pytest.raises(ValueError, match="no usable output length"):
        jsonl_dataset(DATA / "prompts.jsonl", bpe)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "fine", "output_tokens": 3}\n{"text": "no prompt"}\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: .*prompt"):
        jsonl_dataset(bad, bpe)


@pytest.mark.parametrize("name", ["bpe", "words"])
def test_prefix_groups_share_their_prefix_exactly(name, request):
    tokenizer = request.getfixturevalue(name)
    specs = prefix_dataset(tokenizer, n_groups=4, per_group=5, prefix_len=48, suffix_len="uniform:4:24",
                           output_len=16, seed=31)
    assert len(specs) == 20
    assert [s.group for s in specs[:4]] == ["g0", "g1", "g2", "g3"]  # interleaved: groups alternate
    assert_token_exact(tokenizer, specs)
    for group in {s.group for s in specs}:
        members = [s for s in specs if s.group == group]
        prefixes = {s.prompt_token_ids[:48] for s in members}
        assert len(prefixes) == 1
        assert len({s.prompt_token_ids[48:] for s in members}) == len(members)  # suffixes differ
    other_groups = {s.prompt_token_ids[:48] for s in specs}
    assert len(other_groups) == 4


def test_registry(bpe):
    assert make_dataset("random", bpe, 2, 8, 4, seed=2) == random_dataset(bpe, 2, 8, 4, seed=2)
    with pytest.raises(ValueError, match="unknown dataset"):
        make_dataset("nope", bpe)
