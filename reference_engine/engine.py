"""The engine: requests in, tokens out, one `step()` at a time.

    engine = Engine(EngineConfig(model="random:tiny", device="cpu"))
    outs = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0.0))

Its start-up is `engine_builder.build_engine` (each phase timed); each step schedules (`scheduler.py`), runs
the model once (`model_runner.py`) and samples (`sampler.py`), either synchronously (`run_step`) or with the
next step queued on the device before this one's tokens are read (`overlap.py`, on by default on CUDA).
"""

from __future__ import annotations

import functools
import itertools
import logging
from typing import TYPE_CHECKING

import torch

from reference_engine.block_manager import BlockManager
from reference_engine.config import EngineConfig, SamplingParams
from reference_engine.engine_builder import build_engine
from reference_engine.engine_info import EngineStats, RequestLimits
from reference_engine.overlap import OverlappedSteps
from reference_engine.sampler import Sampler
from reference_engine.scheduler import SHARE_EXPONENTS, ScheduledBatch, Scheduler
from reference_engine.sequence import RequestOutput, Sequence, Status
from reference_engine.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("reference_engine")


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        built = build_engine(config)
        self.setup = built.setup
        self.config = config = built.config
        self.device, self.dtype, self.spec = built.device, built.dtype, built.spec
        self.max_model_len, self.tokenizer_source = built.max_model_len, built.tokenizer_source
        self.runner = built.runner
        self.block_manager = BlockManager(
            built.num_kv_blocks, config.block_size, config.enable_prefix_caching
        )
        self.scheduler = Scheduler(
            self.block_manager,
            config.max_num_seqs,
            config.max_num_batched_tokens,
            config.mixed_prefill_tokens,
            SHARE_EXPONENTS[config.mixed_prefill_share],
        )
        self.sampler = Sampler(self.spec.eos_token_ids, self.device, config.seed)
        self.eos_token_ids = set(self.spec.eos_token_ids)
        self._seqs: dict[str, Sequence] = {}
        self._ids = itertools.count()
        self._arrivals = itertools.count()
        overlap = config.async_scheduling
        if overlap is None:
            overlap = self.device.type == "cuda"
        self.overlap = OverlappedSteps(self) if overlap else None

    @property
    def async_scheduling(self) -> bool:
        return self.overlap is not None

    @property
    def num_overlapped_steps(self) -> int:
        """Steps queued before the previous step's tokens were read."""
        return self.overlap.num_overlapped_steps if self.overlap is not None else 0

    @property
    def num_overlapped_admissions(self) -> int:
        """Requests admitted into such steps."""
        return self.overlap.num_overlapped_admissions if self.overlap is not None else 0

    # ---- requests -------------------------------------------------------------------------------------

    def add_request(
        self, prompt_token_ids: list[int], params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        """Queue a request; raises ValueError for input the engine cannot serve exactly as asked."""
        params = params or SamplingParams()
        prompt = list(prompt_token_ids)
        self.validate_request(prompt, params)
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self._seqs:
            raise ValueError(f"request id {request_id!r} is already in use")
        generator = None
        if params.seed is not None:
            generator = torch.Generator(device=self.device).manual_seed(params.seed)
        seq = Sequence(request_id, prompt, params, next(self._arrivals), generator)
        self._seqs[request_id] = seq
        self.scheduler.add(seq)
        return request_id

    def validate_request(self, prompt: list[int], params: SamplingParams) -> None:
        """Raise ValueError, with a message fit for a client, for a request this engine cannot serve."""
        RequestLimits(
            self.spec.vocab_size, self.max_model_len, self.block_size, self.block_manager.num_blocks
        ).validate(prompt, params)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Stop a request now and free its blocks; None if it is unknown or already finished."""
        seq = self._seqs.pop(request_id, None)
        if seq is None:
            return None
        self.scheduler.remove(seq)
        seq.status, seq.finish_reason = Status.FINISHED, "abort"
        return RequestOutput.of(seq, [])

    @functools.cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """The model's tokenizer (or the synthetic one of random weights), loaded on first use."""
        return load_tokenizer(None, self.spec, self.tokenizer_source)

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    @torch.inference_mode()
    def step(self) -> list[RequestOutput]:
        """Schedule, run the model once, sample; return the requests that gained a token this step."""
        if self.overlap is not None:
            return self.overlap.step()
        return self.run_step(self.scheduler.schedule())

    @property
    def block_size(self) -> int:
        return self.block_manager.block_size

    def run_step(self, batch: ScheduledBatch) -> list[RequestOutput]:
        """Run a scheduled batch and wait for its tokens (the synchronous step)."""
        if not batch.items:
            if self.scheduler.has_work():
                raise RuntimeError(f"no request could be scheduled ({self.stats()}); this is an engine bug")
            return []
        logits, sampling = self.runner.execute(batch.items)
        for seq, n in batch.items:
            seq.num_computed_tokens += n
            self.block_manager.register_full_blocks(seq)
        if not sampling:
            return []
        tokens = self.sampler(logits, sampling)
        return [self.append_token(seq, token) for seq, token in zip(sampling, tokens, strict=True)]

    def append_token(self, seq: Sequence, token: int) -> RequestOutput:
        """Add a sampled token to its sequence and end the request if it stops there."""
        seq.token_ids.append(token)
        reason = self._finish_reason(seq, token)
        if reason is not None:
            self.scheduler.remove(seq)
            self._seqs.pop(seq.request_id, None)
            seq.status, seq.finish_reason = Status.FINISHED, reason
        return RequestOutput.of(seq, [token])

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        params = seq.params
        if seq.num_output_tokens >= params.min_tokens:
            if not params.ignore_eos and token in self.eos_token_ids:
                return "stop"
            if token in params.stop_token_ids:
                return "stop"
        if seq.num_output_tokens >= params.max_tokens or len(seq) >= self.max_model_len:
            return "length"
        return None

    def generate(
        self,
        prompts: list[list[int]] | list[str],
        params: SamplingParams | list[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Run prompts (token ids, or text to encode) to completion; outputs in the order given."""
        if not isinstance(params, list):
            params = [params or SamplingParams()] * len(prompts)
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        ids = []
        for prompt, p in zip(prompts, params, strict=True):
            tokens = self.tokenizer.encode(prompt) if isinstance(prompt, str) else prompt
            ids.append(self.add_request(tokens, p))
        final: dict[str, RequestOutput] = {}
        while len(final) < len(ids):
            for out in self.step():
                if out.finished:
                    final[out.request_id] = out
        return [final[i] for i in ids]

    def stats(self) -> EngineStats:
        bm = self.block_manager
        return EngineStats(
            running=len(self.scheduler.running),
            waiting=len(self.scheduler.waiting),
            kv_blocks_total=bm.num_blocks,
            kv_blocks_used=bm.num_used_blocks,
            kv_blocks_free=bm.num_free_blocks,
            prefix_queried_tokens=bm.prefix_queried_tokens,
            prefix_hit_tokens=bm.prefix_hit_tokens,
            preemptions=self.scheduler.num_preemptions,
        )
