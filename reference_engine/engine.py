"""The engine: requests in, tokens out, one `step()` at a time.

    engine = Engine(EngineConfig(model="random:tiny", device="cpu"))
    outs = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=8, temperature=0.0))

Overlapped decode (`async_scheduling`): in steady-state decode, `step()` queues model step N+1 before it
reads step N's sampled tokens, and returns step N's outputs, so the device works on N+1 while the host
post-processes N and prepares N+2. Step N+1's positions, slots and block tables assume every sequence goes on
(those certain to stop at N by length are left out); its token ids are copied on the device from N's samples.
A sequence that stops at N by EOS, a stop token or an abort had one more row computed in N+1: that row is
dropped, and it wrote only into the sequence's own blocks, which later steps can reuse only after N+1 (one
stream runs the steps in order). A step in which every sequence samples (decodes, and prompts whose last chunk
it carries) is itself queued without waiting for its tokens, so the decode step after a prefill overlaps too.
Waiting requests join step N+1 beside its decodes (the scheduler admits them as it would after those decodes,
without preempting; their prompt tokens are on the host), so a stream of arrivals does not stop the overlap.
A step that cannot be a decode of every running sequence (one still on a prompt chunk that samples nothing, a
preemption, too few free blocks, a token budget smaller than the batch) waits for the step in flight and runs
synchronously; min_tokens does not (the sampler bans stop tokens by the position being sampled, which the host
knows, so a benchmark's forced output length overlaps too). Each call still returns one model step's
outputs; a request that arrives mid-run joins one step later than without overlap, and unseeded random
sampling draws differ from the synchronous path's where a dropped row took draws; greedy and
per-request-seeded tokens are the same.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from reference_engine.block_manager import BlockManager
from reference_engine.config import EngineConfig, SamplingParams
from reference_engine.engine_info import EngineStartup, EngineStats, RequestLimits
from reference_engine.loader import resolve_dtype, resolve_model
from reference_engine.model_runner import ModelRunner, lookahead_inputs, step_inputs
from reference_engine.sampler import Sampler
from reference_engine.scheduler import SHARE_EXPONENTS, ScheduledBatch, Scheduler
from reference_engine.sequence import RequestOutput, Sequence, Status
from reference_engine.tokenizer import load_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger("reference_engine")

DEFAULT_MAX_MODEL_LEN = 4096
DEFAULT_CPU_KV_BUDGET = 1024**3


@dataclass
class InFlightStep:
    """A step queued on the device whose sampled tokens the host has not read yet: one row per sequence that
    samples (decodes, and prompts whose last chunk it carries)."""

    seqs: list[Sequence]  # one per row, in row order
    tokens: torch.Tensor  # the sampled token ids, on the device
    host: torch.Tensor  # their copy on the host (pinned on CUDA); complete once `ready` has passed
    ready: torch.cuda.Event | None
    logprob_rows: list[int]  # the rows that asked for logprobs ...
    host_logprobs: torch.Tensor | None  # ... and their chosen tokens' logprobs, on the host like `host`

    @property
    def live(self) -> bool:
        return any(seq.status is Status.RUNNING for seq in self.seqs)

    def results(self) -> tuple[list[int], dict[int, float]]:
        """Each row's token, and the logprobs by row; waits for the device."""
        if self.ready is not None:
            self.ready.synchronize()
        logprobs = self.host_logprobs.tolist() if self.host_logprobs is not None else []
        return self.host.tolist(), dict(zip(self.logprob_rows, logprobs, strict=True))


class Engine:
    def __init__(self, config: EngineConfig) -> None:
        self.setup = EngineStartup()
        t0 = time.perf_counter()
        self.device = _resolve_device(config.device)
        self.config = config = config.for_device(self.device.type)
        self.dtype = resolve_dtype(config.dtype, self.device)
        resolved = resolve_model(config.model)
        self.spec = resolved.spec
        self.max_model_len = self._max_model_len(config)
        # the tokenizer is loaded on first use (`tokenizer`): an engine core serves token ids, and its front
        # end loads the tokenizer itself, so the core imports no transformers
        checkpoint = str(resolved.checkpoint) if resolved.checkpoint is not None else None
        self.tokenizer_source = config.tokenizer or checkpoint
        t1 = time.perf_counter()
        self._phase("resolve_model", t1 - t0, f"model {config.model} resolved")
        # what a comparison needs to check that backends were set up alike (adapters/reference.py reads it)
        eager = config.enforce_eager or self.device.type != "cuda"
        log.info("engine config: model=%s, dtype=%s, max_model_len=%d, max_num_seqs=%d, "
                 "max_num_batched_tokens=%d, mixed_prefill_tokens=%s, block_size=%d, "
                 "enable_prefix_caching=%s, enforce_eager=%s, quantization=none, device=%s", config.model,
                 str(self.dtype).removeprefix("torch."), self.max_model_len, config.max_num_seqs,
                 config.max_num_batched_tokens,
                 config.mixed_prefill_tokens or f"shared ({config.mixed_prefill_share})",
                 config.block_size, config.enable_prefix_caching, eager, self.device)
        torch.manual_seed(config.seed)
        self.runner = ModelRunner(resolved, self.device, self.dtype, self.max_model_len, config.block_size,
                                  config.seed, config.kernels, config.cpu_linear)
        self.setup.weights_bytes = self.runner.weights_bytes
        t2 = time.perf_counter()
        self._phase("load_weights", t2 - t1,
                    f"weights loaded: {self.setup.weights_bytes / 2**30:.3f} GiB, {self.dtype} "
                    f"on {self.device}")
        num_blocks = self._num_kv_blocks(config)
        self.runner.allocate_kv_cache(num_blocks)
        self.setup.num_kv_blocks = num_blocks
        self.setup.kv_cache_bytes = num_blocks * self.runner.kv_bytes_per_block()
        t3 = time.perf_counter()
        self._phase("allocate_kv_cache", t3 - t2,
                    f"KV cache allocated: {num_blocks} blocks of {config.block_size} tokens, "
                    f"{self.setup.kv_cache_bytes / 2**30:.3f} GiB")
        if self.device.type == "cuda" and not config.enforce_eager:
            report = self.runner.capture_cuda_graphs(config.max_num_seqs, config.cuda_graph_batch_sizes,
                                                     config.cuda_graph_context_bounds)
            self.setup.cuda_graph_buckets = sorted(report.seconds_per_bucket)
            self.setup.cuda_graph_warmup_seconds = report.warmup_seconds
            self.setup.cuda_graph_capture_seconds = dict(report.seconds_per_bucket)
            self.setup.cuda_graph_pool_bytes = report.pool_bytes
            self._phase("capture_cuda_graphs", report.total_seconds,
                        f"CUDA graphs captured: {len(report.seconds_per_bucket)} buckets "
                        f"{self.setup.cuda_graph_buckets}, pool {report.pool_bytes / 2**30:.3f} GiB")
            log.info("CUDA graphs: first-use warm-up %.3f s, then per bucket %s; context bounds %s",
                     report.warmup_seconds,
                     ", ".join(f"{size}: {sec:.3f} s" for size, sec in report.seconds_per_bucket.items()),
                     report.context_bounds)
            mixed = self.runner.capture_mixed_graphs(config.max_num_batched_tokens,
                                                     config.mixed_cuda_graph_sizes)
            self.setup.mixed_graph_sizes, self.setup.mixed_graph_pool_bytes = mixed.sizes, mixed.pool_bytes
            self._phase("capture_mixed_graphs", mixed.seconds,
                        f"CUDA graphs for steps with prompt tokens: {mixed.graphs} pieces over token counts "
                        f"{mixed.sizes}, pool {mixed.pool_bytes / 2**30:.3f} GiB")
        if config.warm_up if config.warm_up is not None else self.device.type == "cuda":
            t4 = time.perf_counter()
            steps = self.runner.warm_up(config.max_num_seqs, config.max_num_batched_tokens)
            self._phase("warm_up", time.perf_counter() - t4, f"eager steps warmed up: {steps} step shapes")
        self.setup.device, self.setup.dtype = str(self.device), str(self.dtype).removeprefix("torch.")
        self.block_manager = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        self.scheduler = Scheduler(self.block_manager, config.max_num_seqs, config.max_num_batched_tokens,
                                   config.mixed_prefill_tokens, SHARE_EXPONENTS[config.mixed_prefill_share])
        self.sampler = Sampler(self.spec.eos_token_ids, self.device, config.seed)
        self.eos_token_ids = set(self.spec.eos_token_ids)
        self._seqs: dict[str, Sequence] = {}
        self._ids = itertools.count()
        self._arrivals = itertools.count()
        self.async_scheduling = config.async_scheduling if config.async_scheduling is not None \
            else self.device.type == "cuda"
        self._in_flight: InFlightStep | None = None
        self.num_overlapped_steps = 0  # steps queued before the previous step's tokens were read
        self.num_overlapped_admissions = 0  # requests admitted into such steps
        self.setup.phases["total"] = time.perf_counter() - t0

    def _phase(self, name: str, seconds: float, message: str) -> None:
        self.setup.phases[name] = seconds
        log.info("%s in %.3f s", message, seconds)

    def _max_model_len(self, config: EngineConfig) -> int:
        spec = self.spec
        limit = spec.max_position_embeddings
        if spec.sliding_window:
            limit = min(limit, spec.sliding_window)
        if config.max_model_len is None:
            return min(limit, DEFAULT_MAX_MODEL_LEN)
        if config.max_model_len > limit:
            why = "sliding-window attention is not implemented" if spec.sliding_window == limit else \
                "the model's max_position_embeddings"
            raise ValueError(f"max_model_len {config.max_model_len} exceeds {limit} ({why})")
        return config.max_model_len

    def _num_kv_blocks(self, config: EngineConfig) -> int:
        per_block = self.runner.kv_bytes_per_block()
        if config.num_kv_blocks is not None:
            return config.num_kv_blocks
        if config.kv_cache_memory is not None:
            budget = int(config.kv_cache_memory)
        elif self.device.type == "cuda":
            activations = self.runner.profile_activation_bytes(config.max_num_batched_tokens)
            free, total = torch.cuda.mem_get_info(self.device)
            graphs_reserve = 0 if config.enforce_eager else 1024**3
            budget = int(total * config.gpu_memory_utilization - (total - free) - activations
                         - graphs_reserve)
            log.info("memory: %.2f GiB total, %.2f GiB in use, %.2f GiB peak activations "
                     "-> KV budget %.2f GiB",
                     total / 2**30, (total - free) / 2**30, activations / 2**30, budget / 2**30)
        else:
            full = -(-self.max_model_len // config.block_size) * config.max_num_seqs * per_block
            budget = min(full, DEFAULT_CPU_KV_BUDGET)
        blocks = budget // per_block
        if blocks < 1:
            raise ValueError(f"KV cache budget of {budget} bytes holds no {per_block}-byte block")
        return blocks

    # ---- requests -------------------------------------------------------------------------------------

    def add_request(self, prompt_token_ids: list[int], params: SamplingParams | None = None,
                    request_id: str | None = None) -> str:
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
        RequestLimits(self.spec.vocab_size, self.max_model_len, self.block_size,
                      self.block_manager.num_blocks).validate(prompt, params)

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
        if not self.async_scheduling:
            return self._step_sync(self.scheduler.schedule())
        flight = self._in_flight
        if flight is not None and not flight.live:  # every row stopped or was aborted since it was queued
            flight.results()
            flight = self._in_flight = None
        if flight is None:
            batch = self.scheduler.schedule()
            if not self._launchable(batch):
                return self._step_sync(batch)
            step = step_inputs(batch.items, self.block_size)
            logits = self.runner.run(step)
            for seq, n in batch.items:
                seq.num_computed_tokens += n
                self.block_manager.register_full_blocks(seq)
            flight = self._sample_async(step.sample_seqs, logits)
        rows = self._next_rows(flight)
        self._in_flight = self._launch_next(flight, rows) if rows else None
        return self._collect(flight)

    @property
    def block_size(self) -> int:
        return self.block_manager.block_size

    def _step_sync(self, batch: ScheduledBatch) -> list[RequestOutput]:
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
        return [self._append(seq, token) for seq, token in zip(sampling, tokens, strict=True)]

    def _append(self, seq: Sequence, token: int) -> RequestOutput:
        """Add a sampled token to its sequence and end the request if it stops there."""
        seq.token_ids.append(token)
        reason = self._finish_reason(seq, token)
        if reason is not None:
            self.scheduler.remove(seq)
            self._seqs.pop(seq.request_id, None)
            seq.status, seq.finish_reason = Status.FINISHED, reason
        return RequestOutput.of(seq, [token])

    def _launchable(self, batch: ScheduledBatch) -> bool:
        """A step in which every sequence samples its next token (decodes, and prompts whose last chunk it
        carries), so that it can run without the host waiting and the decode step after it can be queued."""
        return bool(batch.items) and all(seq.num_uncomputed_tokens == n for seq, n in batch.items)

    def _ends_by_length(self, seq: Sequence) -> bool:
        """Whether the token now being sampled for `seq` is certainly its last, whatever its value."""
        return seq.num_output_tokens + 1 >= seq.params.max_tokens or len(seq) + 1 >= self.max_model_len

    def _next_rows(self, flight: InFlightStep) -> list[tuple[int, Sequence]]:
        """The decode rows of the step after `flight` (its row in `flight`, sequence) when that step can be
        queued now: every running sequence decodes in it, as the scheduler would choose once `flight`'s tokens
        were in, less the rows that stop (waiting requests are admitted beside them, `_launch_next`); empty
        when the next step must wait for the tokens and be scheduled."""
        sched, bm = self.scheduler, self.block_manager
        live = [(row, seq) for row, seq in enumerate(flight.seqs) if seq.status is Status.RUNNING]
        if len(live) != len(sched.running):  # a running sequence that was not in this step needs scheduling
            return []
        rows = [(row, seq) for row, seq in live if not self._ends_by_length(seq)]
        if not rows or len(rows) > sched.max_num_batched_tokens:
            return []
        need = sum(bm.blocks_for(seq.num_computed_tokens + 1) - len(seq.block_table) for _, seq in rows)
        return rows if need <= bm.num_free_blocks else []

    def _launch_next(self, flight: InFlightStep, rows: list[tuple[int, Sequence]]) -> InFlightStep:
        """Queue the step after `flight`: its decodes, their input tokens gathered on the device from
        `flight`'s, and the waiting requests the scheduler admits beside them (their prompts are on the
        host), so that arrivals do not make the host wait for the device either."""
        seqs = [seq for _, seq in rows]
        for seq in seqs:
            self.block_manager.grow(seq, seq.num_computed_tokens + 1)
        admitted = self.scheduler.admit_beside_decodes(len(seqs)) if self.scheduler.waiting else []
        step = lookahead_inputs(seqs, self.block_size, admitted)
        logits = self.runner.run(step, gather=(flight.tokens, [row for row, _ in rows]))
        for seq in seqs:
            seq.num_computed_tokens += 1  # its blocks register once the token at that position is known
        for seq, n in admitted:
            seq.num_computed_tokens += n
            self.block_manager.register_full_blocks(seq)
        self.num_overlapped_steps += 1
        self.num_overlapped_admissions += len(admitted)
        # `flight`'s tokens are not appended to the decoding sequences yet
        pending = [1] * len(seqs) + [0] * (len(step.sample_seqs) - len(seqs))
        return self._sample_async(step.sample_seqs, logits, pending)

    def _sample_async(self, seqs: list[Sequence], logits: torch.Tensor, pending: list[int] | None = None
                      ) -> InFlightStep:
        tokens = self.sampler.choose(logits, seqs, pending)
        wanted = [i for i, seq in enumerate(seqs) if seq.params.logprobs]
        logprobs = self.sampler.logprobs(logits, tokens, wanted) if wanted else None
        if tokens.device.type != "cuda":
            return InFlightStep(seqs, tokens, tokens, None, wanted, logprobs)
        host = torch.empty(tokens.shape, dtype=tokens.dtype, pin_memory=True)
        host.copy_(tokens, non_blocking=True)
        host_logprobs = None
        if logprobs is not None:
            host_logprobs = torch.empty(logprobs.shape, dtype=logprobs.dtype, pin_memory=True)
            host_logprobs.copy_(logprobs, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record()
        return InFlightStep(seqs, tokens, host, ready, wanted, host_logprobs)

    def _collect(self, flight: InFlightStep) -> list[RequestOutput]:
        """Wait for a queued step's tokens and apply them; rows of sequences that stopped are dropped."""
        outputs = []
        tokens, logprobs = flight.results()
        for row, (seq, token) in enumerate(zip(flight.seqs, tokens, strict=True)):
            if seq.status is not Status.RUNNING:
                continue
            if row in logprobs:
                seq.logprobs.append(logprobs[row])
            outputs.append(self._append(seq, token))
            if seq.status is Status.RUNNING:
                self.block_manager.register_full_blocks(seq)
        return outputs

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

    def generate(self, prompts: list[list[int]] | list[str],
                 params: SamplingParams | list[SamplingParams] | None = None) -> list[RequestOutput]:
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
            running=len(self.scheduler.running), waiting=len(self.scheduler.waiting),
            kv_blocks_total=bm.num_blocks, kv_blocks_used=bm.num_used_blocks,
            kv_blocks_free=bm.num_free_blocks, prefix_queried_tokens=bm.prefix_queried_tokens,
            prefix_hit_tokens=bm.prefix_hit_tokens, preemptions=self.scheduler.num_preemptions)


def _resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was asked for but no CUDA device is visible")
    return dev
