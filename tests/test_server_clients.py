"""The official `openai` and `text-generation` clients against our server on loopback; the text they receive
equals what the engine generates for the same greedy request."""

from __future__ import annotations

import random

import pytest
from openai import OpenAI
from text_generation import Client

from reference_engine import Engine, EngineConfig, SamplingParams

PROMPTS = [
    "The capital of France is",
    "Write one sentence about the sea:",
    "List three colours:",
    "Translate 'good morning' into Japanese and add an emoji:",
]


@pytest.fixture(scope="module", params=["tiny", "smollm2"])
def setup(request, llama_dir, smollm2_dir):
    """(server, in-process engine on the same checkpoint, served model name)."""
    if request.param == "tiny":
        server = request.getfixturevalue("tiny_server")
        engine = Engine(
            EngineConfig(model=str(llama_dir), device="cpu", max_model_len=256, num_kv_blocks=256)
        )
        return server, engine, str(llama_dir)
    server = request.getfixturevalue("smollm2_server")
    engine = Engine(EngineConfig(model=str(smollm2_dir), device="cpu", max_model_len=1024, num_kv_blocks=256))
    return server, engine, "smollm2"


def expected_text(engine: Engine, prompt_ids: list[int], **params) -> tuple[str, list[int]]:
    """The engine's greedy text. A character whose bytes the generation never completed is not streamed (as
    vLLM does), so a trailing replacement character of the full decode is not expected."""
    out = engine.generate([prompt_ids], SamplingParams(temperature=0.0, **params))[0]
    return engine.tokenizer.decode(out.token_ids, skip_special_tokens=True).rstrip("\ufffd"), out.token_ids


def chat_ids(engine: Engine, content: str) -> list[int]:
    text = engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": content}], tokenize=False, add_generation_prompt=True
    )
    return engine.tokenizer.encode(text, add_special_tokens=False)


def test_openai_completions(setup):
    server, engine, model = setup
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    prompt = random.choice(PROMPTS)
    want, tokens = expected_text(engine, engine.tokenizer.encode(prompt), max_tokens=24, ignore_eos=True)
    done = client.completions.create(
        model=model, prompt=prompt, max_tokens=24, temperature=0.0, extra_body={"ignore_eos": True}
    )
    assert done.choices[0].text == want
    assert done.usage.completion_tokens == 24 == len(tokens)
    assert done.usage.prompt_tokens == len(engine.tokenizer.encode(prompt))
    chunks = list(
        client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=24,
            temperature=0.0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"ignore_eos": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == want
    assert chunks[-1].usage.completion_tokens == 24 and not chunks[-1].choices
    assert len([c for c in chunks if c.choices]) == 24  # one chunk per token, empty-text ones included
    # Token ids as the prompt.
    ids = engine.tokenizer.encode(prompt)
    by_ids = client.completions.create(
        model=model, prompt=ids, max_tokens=24, temperature=0.0, extra_body={"ignore_eos": True}
    )
    assert by_ids.choices[0].text == want


def test_openai_chat(setup):
    server, engine, model = setup
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    content = random.choice(PROMPTS)
    want, tokens = expected_text(engine, chat_ids(engine, content), max_tokens=32)
    done = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}], max_tokens=32, temperature=0.0
    )
    assert done.choices[0].message.content == want
    assert done.usage.completion_tokens == len(tokens)
    chunks = list(
        client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": content}],
            max_tokens=32,
            temperature=0.0,
            stream=True,
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[0].choices[0].delta.content == ""
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want
    assert chunks[-1].choices[0].finish_reason in ("stop", "length")


def test_text_generation_client(setup):
    server, engine, _ = setup
    client = Client(server.url, timeout=120)
    prompt = random.choice(PROMPTS)
    want, tokens = expected_text(engine, engine.tokenizer.encode(prompt), max_tokens=20)
    resp = client.generate(prompt, max_new_tokens=20)
    assert resp.generated_text == want
    assert resp.details.generated_tokens == len(tokens)
    assert [t.id for t in resp.details.tokens] == tokens
    assert all(t.logprob <= 0.0 for t in resp.details.tokens)
    streamed = list(client.generate_stream(prompt, max_new_tokens=20))
    assert [r.token.id for r in streamed] == tokens
    assert "".join(r.token.text for r in streamed) == want
    assert streamed[-1].generated_text == want
    assert streamed[-1].details.generated_tokens == len(tokens)
    assert all(r.generated_text is None for r in streamed[:-1])


def test_seeded_sampling_over_http_is_reproducible(setup):
    server, engine, model = setup
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    kwargs = dict(
        model=model,
        prompt=PROMPTS[0],
        max_tokens=16,
        temperature=0.9,
        top_p=0.9,
        seed=7,
        extra_body={"ignore_eos": True},
    )
    first = client.completions.create(**kwargs).choices[0].text
    assert client.completions.create(**kwargs).choices[0].text == first
    sampling = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.9, seed=7, ignore_eos=True)
    out = engine.generate([engine.tokenizer.encode(PROMPTS[0])], sampling)[0]
    assert engine.tokenizer.decode(out.token_ids, skip_special_tokens=True) == first


def test_stop_string_truncates_and_reports_it(setup):
    server, engine, model = setup
    client = OpenAI(base_url=server.url + "/v1", api_key="unused")
    prompt = random.choice(PROMPTS)
    want, _ = expected_text(engine, engine.tokenizer.encode(prompt), max_tokens=24, ignore_eos=True)
    stop = want[len(want) // 2 : len(want) // 2 + 3]
    if not stop.strip():
        stop = want[-3:]
    done = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=24,
        temperature=0.0,
        stop=[stop],
        extra_body={"ignore_eos": True},
    )
    assert done.choices[0].text == want[: want.index(stop)]
    assert done.choices[0].finish_reason == "stop"
    assert done.model_extra.get("choices") is None and done.choices[0].model_extra["stop_reason"] == stop
