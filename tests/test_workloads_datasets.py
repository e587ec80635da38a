"""Datasets: token-exact prompts (checked through the tokenizer), length distributions, files, prefixes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest
from checkpoints import make_tokenizer
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from workloads.catalog import DATASETS, Random, dataset_named, register
from workloads.datasets import (
    LengthDist,
    fixed_dataset,
    jsonl_dataset,
    prefix_dataset,
    random_dataset,
    sharegpt_dataset,
    token_exact_prompt,
)

DATA = Path(__file__).parent / "data"


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("bpe")


@pytest.fixture(scope="module")
def bpe(bpe_dir):
    """A byte-level BPE tokenizer trained here on multilingual text (merges, multi-byte characters), saved
    in `bpe_dir`."""
    return make_tokenizer(bpe_dir)


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
    assert b.wanted_output_tokens == len(
        bpe.encode("Temperature, top-p and top-k.", add_special_tokens=False)
    )
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
        ("jsonl-short", 32),
        ("jsonl-default-length", 50),
        ("jsonl-4", 64),
    ]
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
    specs = prefix_dataset(
        tokenizer, n_groups=4, per_group=5, prefix_len=48, suffix_len="uniform:4:24", output_len=16, seed=31
    )
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


def test_the_catalog_holds_each_dataset_once_and_each_is_pinned():
    names = ["random", "fixed", "sharegpt", "jsonl", "prefix", "multi-turn", "sharegpt-turns"]
    assert list(DATASETS) == names  # the order of --dataset's help
    assert dataset_named("prefix") is DATASETS["prefix"]
    with pytest.raises(ValueError, match="unknown dataset 'nope'; known: random, fixed, sharegpt"):
        dataset_named("nope")
    with pytest.raises(ValueError, match="declared twice"):
        register(type("Again", (Random,), {}))
    assert set(PINNED_OPTIONS) == set(PINS) == set(DATASETS)  # a new dataset: its options and pins below


# -- what each dataset makes, pinned ------------------------------------------------------------------------

#: a conversation of three answered turns (sharegpt-turns), and one of two
CONVERSATIONS = [
    {
        "id": "c",
        "conversations": [
            {"from": f, "value": v}
            for f, v in [
                ("human", "First question?"),
                ("gpt", "An answer."),
                ("human", "Second?"),
                ("gpt", "Two."),
                ("human", "And a third one?"),
                ("gpt", "Three."),
            ]
        ],
    },
    {
        "id": "d",
        "conversations": [
            {"from": f, "value": v}
            for f, v in [("human", "Hello there?"), ("gpt", "Hi."), ("human", "Bye?"), ("gpt", "Bye.")]
        ],
    },
]
#: each dataset's options in the pinned plan, and in the recipe's test (tests/test_recipes.py). Paths name the
#: files `example_files` writes: those of tests/data, and `CONVERSATIONS`
PINNED_OPTIONS = {
    "random": {"input_len": "uniform:4:12", "output_len": "3"},
    "fixed": {},
    "sharegpt": {"dataset_path": "sharegpt_small.json"},
    "jsonl": {"dataset_path": "prompts.jsonl", "output_len": "5"},
    "prefix": {"input_len": "4", "output_len": "2", "prefix_len": 8, "prefix_groups": 2},
    "multi-turn": {"input_len": "5", "output_len": "2", "turns": 2, "think_time": "uniform:0:1"},
    "sharegpt-turns": {"dataset_path": "conversations.json", "turns": 2, "think_time": "exponential:1"},
}
#: per dataset: its manifest entry (values other than None and ""), the ids of slice 0's first requests, the
#: first token ids of its first prompt, and a digest of everything the point slices hold (see `_pinned`)
PINS: dict[str, tuple[dict, list[str], list[int], str]] = {
    "random": (
        {
            "dataset": "random",
            "input_len": "uniform:4:12",
            "output_len": "3",
            "label": "random-uniform:4:12x3",
        },
        ["random0-0", "random0-1", "random0-2"],
        [270, 321, 335, 57, 16, 75],
        "7892cbb82f57c9b7",
    ),
    "fixed": (
        {"dataset": "fixed", "input_len": "128", "output_len": "16", "label": "fixed"},
        ["fixed0-0", "fixed0-1", "fixed0-2"],
        [366, 282, 298, 355, 270, 321],
        "740d7b301d7be900",
    ),
    "sharegpt": (
        {
            "dataset": "sharegpt",
            "input_len": "128",
            "output_len": "16",
            "path": "sharegpt_small.json",
            "label": "sharegpt-sharegpt_small",
        },
        ["sharegpt-conv-a", "sharegpt-conv-b", "sharegpt-conv-d"],
        [57, 74, 75, 353, 299, 357],
        "cf3b961184781c51",
    ),
    "jsonl": (
        {
            "dataset": "jsonl",
            "input_len": "128",
            "output_len": "5",
            "path": "prompts.jsonl",
            "label": "jsonl-prompts",
        },
        ["jsonl-short", "jsonl-default-length", "jsonl-4"],
        [39, 90, 82, 78, 67, 270],
        "244dec1c779e2552",
    ),
    "prefix": (
        {
            "dataset": "prefix",
            "input_len": "4",
            "output_len": "2",
            "prefix_len": 8,
            "prefix_groups": 2,
            "label": "prefix-2x8+4x2",
        },
        ["prefix0-g0-0", "prefix0-g1-0", "prefix0-g0-1"],
        [366, 282, 298, 355, 270, 321],
        "15e09128eb8d0a55",
    ),
    "multi-turn": (
        {
            "dataset": "multi-turn",
            "input_len": "5",
            "output_len": "2",
            "turns": 2,
            "think_time": "uniform:0:1",
            "label": "multi-turn-2x5x2",
        },
        ["session0-0-t0", "session0-0-t1", "session0-1-t0"],
        [34, 326, 31, 210, 331],
        "0ee16266cfdf8210",
    ),
    "sharegpt-turns": (
        {
            "dataset": "sharegpt-turns",
            "input_len": "128",
            "output_len": "16",
            "path": "conversations.json",
            "turns": 2,
            "think_time": "exponential:1",
            "label": "sharegpt-turns-conversations",
        },
        ["sharegpt-c-t0", "sharegpt-c-t1", "sharegpt-d-t0"],
        [40, 75, 84, 85, 86, 223],
        "7c74ac34e2721208",
    ),
}


def _requests(items: list) -> list:
    """The requests of a point's items: a session's turns in order, or the item itself."""
    return [turn for item in items for turn in getattr(item, "turns", (item,))]


def _digest(items: list) -> str:
    rows = [
        (s.request_id, list(s.prompt_token_ids), s.prompt_text, s.wanted_output_tokens, s.group)
        for s in _requests(items)
    ]
    rows += [(item.session_id, list(item.think_s)) for item in items if hasattr(item, "think_s")]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=False).encode()).hexdigest()[:16]


def _pinned(dataset: str, tok_dir: Path, tokenizer, files: Path) -> tuple[dict, list[str], list[int], str]:
    """What compare's plan and `Prompts` make of `dataset` with `PINNED_OPTIONS`, seed 7, two load points
    of 4 requests: the manifest entry, slice 0's first ids and first prompt's first tokens, and a digest of
    both slices (a stream's chunk 1 too, which carries on its ids), the warm-up and the cold requests."""
    from compare.measure.load_points import FixedPoints
    from compare.measure.prompts import Prompts
    from compare.plan.build import build_plan
    from workloads.datasets import PromptStream

    plan = build_plan(
        {
            "backends": "vllm",
            "endpoints": ["vllm=http://127.0.0.1:9"],
            "model": "m",
            "tokenizer": str(tok_dir),
            "dataset": dataset,
            "num_requests": 4,
            "seed": 7,
            "concurrency": "1,2",
            "warmup": 1,
            **dataset_options(dataset, files),
        }
    )
    (entry,) = plan.describe()["workloads"]
    entry = {k: Path(v).name if k == "path" else v for k, v in entry.items() if v not in (None, "")}
    prompts = Prompts(plan, tokenizer, FixedPoints.most_points(plan))
    [(_, slices)] = prompts.workloads
    made = []
    for source in slices:
        made.append(source.first(4) if isinstance(source, PromptStream) else list(source))
        if isinstance(source, PromptStream):
            made.append(source.chunk(1))
    first = _requests(made[0])
    everything = [item for items in [*made, *prompts.warm, prompts.cold] for item in items]
    return entry, [s.request_id for s in first[:3]], list(first[0].prompt_token_ids[:6]), _digest(everything)


def example_files(out: Path) -> Path:
    """`out`, holding the files `PINNED_OPTIONS` names."""
    for name in ("sharegpt_small.json", "prompts.jsonl"):
        (out / name).write_bytes((DATA / name).read_bytes())
    (out / "conversations.json").write_text(json.dumps(CONVERSATIONS))
    return out


def dataset_options(dataset: str, files: Path) -> dict:
    """`PINNED_OPTIONS[dataset]`, a path made a file of `files` (`example_files`)."""
    options = dict(PINNED_OPTIONS[dataset])
    if "dataset_path" in options:
        options["dataset_path"] = str(files / options["dataset_path"])
    return options


@pytest.fixture(scope="module")
def pin_files(tmp_path_factory) -> Path:
    return example_files(tmp_path_factory.mktemp("files"))


@pytest.mark.parametrize("dataset", list(PINNED_OPTIONS))
def test_every_dataset_makes_the_prompts_and_label_it_made_before(dataset, bpe_dir, bpe, pin_files):
    """The same seed gives the same prompts, ids, output lengths, think times and manifest entry as when
    these were pinned (the datasets as functions named in compare/, before their declarations)."""
    assert _pinned(dataset, bpe_dir, bpe, pin_files) == PINS[dataset]
