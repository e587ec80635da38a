"""Greedy tokens and logits of the engine against Hugging Face transformers on the same weights."""

from __future__ import annotations

import random

import pytest
import torch

from reference_engine import Engine, EngineConfig, SamplingParams

NEW_TOKENS = 64
# Mixed lengths on both sides of the 16- and 32-token block boundaries.
PROMPT_LENGTHS = [1, 7, 15, 16, 17, 31, 33, 47, 64, 70]


class LogitRecorder:
    """Wraps the engine's sampler to keep every row of logits it is handed, per request."""

    def __init__(self, sampler) -> None:
        self.sampler = sampler
        self.logits: dict[str, list[torch.Tensor]] = {}

    def __call__(self, logits, seqs):
        for row, seq in enumerate(seqs):
            self.logits.setdefault(seq.request_id, []).append(logits[row].clone())
        return self.sampler(logits, seqs)


def hf_model(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # ignore_eos: never stop, never mask EOS
    return model


def hf_greedy(hf, prompt: list[int]) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy tokens for a prompt, and its teacher-forced logits at every generated position."""
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = hf.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            pad_token_id=0,
        )
        generated = out[0, len(prompt) :].tolist()
        logits = hf(torch.tensor([prompt + generated[:-1]])).logits[0, len(prompt) - 1 :]
    return generated, logits


def well_separated(logits: torch.Tensor) -> bool:
    """Greedy decoding is only well defined where the best logit beats the runner-up by more than float32
    noise; prompts whose greedy path passes a near-tie are redrawn (judged on transformers' logits alone)."""
    top2 = logits.topk(2, dim=-1).values
    return bool(((top2[:, 0] - top2[:, 1]) > 1e-3 * logits.std()).all())


def check_against_transformers(path, block_sizes, lengths=PROMPT_LENGTHS, cpu_linear: str = "onednn") -> None:
    hf = hf_model(path)
    rng = random.Random()  # fresh prompts every run
    vocab = hf.config.vocab_size
    prompts, expected, full_logits = [], [], []
    for n in lengths:
        for _ in range(20):
            prompt = [rng.randrange(3, vocab) for _ in range(n)]
            generated, logits = hf_greedy(hf, prompt)
            if well_separated(logits):
                break
        else:
            raise AssertionError(f"no well-separated greedy path in 20 random prompts of length {n}")
        prompts.append(prompt)
        expected.append(generated)
        full_logits.append(logits)
    params = SamplingParams(max_tokens=NEW_TOKENS, temperature=0.0, ignore_eos=True)
    for block_size in block_sizes:
        engine = Engine(
            EngineConfig(
                model=str(path),
                device="cpu",
                dtype="float32",
                block_size=block_size,
                max_num_seqs=len(prompts),
                cpu_linear=cpu_linear,
            )
        )
        recorder = LogitRecorder(engine.sampler)
        engine.sampler = recorder
        outs = engine.generate(prompts, params)
        for prompt, out, want, ref in zip(prompts, outs, expected, full_logits, strict=True):
            assert out.token_ids == want, f"block_size={block_size}, prompt length {len(prompt)}"
            ours = torch.stack(recorder.logits[out.request_id])
            rel = ((ours - ref).norm(dim=-1) / ref.norm(dim=-1)).max().item()
            assert rel < 1e-4, (
                f"block_size={block_size}, prompt length {len(prompt)}: relative error {rel:.2e}"
            )
        stats = engine.stats()
        assert stats.kv_blocks_used == 0 and stats.running == 0 and stats.waiting == 0


@pytest.mark.parametrize("cpu_linear", ["onednn", "torch"])
def test_tiny_llama_matches_transformers(llama_dir, cpu_linear):
    check_against_transformers(llama_dir, [1, 16, 32], cpu_linear=cpu_linear)


@pytest.mark.parametrize("cpu_linear", ["onednn", "torch"])
def test_tiny_qwen2_matches_transformers(qwen2_dir, cpu_linear):
    check_against_transformers(qwen2_dir, [1, 16, 32], cpu_linear=cpu_linear)


def test_tiny_mistral_matches_transformers(mistral_dir):
    check_against_transformers(mistral_dir, [16])


@pytest.mark.slow
def test_smollm2_matches_transformers(smollm2_dir):
    check_against_transformers(smollm2_dir, [1, 16, 32], lengths=[1, 9, 16, 17, 30, 33, 48, 65])


def test_smollm2_answers_sensibly(smollm2_dir):
    """The converted checkpoint is the real instruct model, not noise: it knows a capital city."""
    engine = Engine(EngineConfig(model=str(smollm2_dir), device="cpu", max_num_seqs=2))
    tok = engine.tokenizer
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        tokenize=True,
        return_dict=False,
    )
    out = engine.generate([prompt], SamplingParams(max_tokens=24, temperature=0.0))[0]
    assert "Paris" in tok.decode(out.token_ids)
    assert out.finish_reason == "stop" and out.token_ids[-1] in engine.eos_token_ids
