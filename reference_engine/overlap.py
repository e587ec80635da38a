"""Overlapped steps (`async_scheduling`): the device works on step N+1 while the host reads step N's tokens.

In steady-state decode, `OverlappedSteps.step` queues model step N+1 before it reads step N's sampled tokens,
and returns step N's outputs, so the device works on N+1 while the host post-processes N and prepares N+2.
Step N+1's positions, slots and block tables assume every sequence goes on (those certain to stop at N by
length are left out); its token ids are copied on the device from N's samples. A sequence that stops at N by
EOS, a stop token or an abort had one more row computed in N+1: that row is dropped, and it wrote only into
the sequence's own blocks, which later steps can reuse only after N+1 (one stream runs the steps in order). A
step in which every sequence samples (decodes, and prompts whose last chunk it carries) is itself queued
without waiting for its tokens, so the decode step after a prefill overlaps too. Waiting requests join step
N+1 beside its decodes (the scheduler admits them as it would after those decodes, without preempting; their
prompt tokens are on the host), so a stream of arrivals does not stop the overlap. A step that cannot be a
decode of every running sequence (one still on a prompt chunk that samples nothing, a preemption, too few
free blocks, a token budget smaller than the batch) waits for the step in flight and runs synchronously;
min_tokens does not (the sampler bans stop tokens by the position being sampled, which the host knows, so a
benchmark's forced output length overlaps too). Each call still returns one model step's outputs; a request
that arrives mid-run joins one step later than without overlap, and unseeded random sampling draws differ
from the synchronous path's where a dropped row took draws; greedy and per-request-seeded tokens are the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from reference_engine.model_runner import lookahead_inputs, step_inputs
from reference_engine.scheduler import ScheduledBatch
from reference_engine.sequence import RequestOutput, Sequence, Status

if TYPE_CHECKING:
    from reference_engine.engine import Engine


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


class OverlappedSteps:
    """The engine's steps with one step in flight on the device; the engine's synchronous step (`run_step`)
    where a step cannot be queued ahead."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.in_flight: InFlightStep | None = None
        self.num_overlapped_steps = 0  # steps queued before the previous step's tokens were read
        self.num_overlapped_admissions = 0  # requests admitted into such steps

    def step(self) -> list[RequestOutput]:
        """One model step's outputs: the step in flight's, after queuing the next one when it can be."""
        engine = self.engine
        flight = self.in_flight
        if flight is not None and not flight.live:  # every row stopped or was aborted since it was queued
            flight.results()
            flight = self.in_flight = None
        if flight is None:
            batch = engine.scheduler.schedule()
            if not self._launchable(batch):
                return engine.run_step(batch)
            step = step_inputs(batch.items, engine.block_size)
            logits = engine.runner.run(step)
            for seq, n in batch.items:
                seq.num_computed_tokens += n
                engine.block_manager.register_full_blocks(seq)
            flight = self._sample(step.sample_seqs, logits)
        rows = self._next_rows(flight)
        self.in_flight = self._launch_next(flight, rows) if rows else None
        return self._collect(flight)

    @staticmethod
    def _launchable(batch: ScheduledBatch) -> bool:
        """A step in which every sequence samples its next token (decodes, and prompts whose last chunk it
        carries), so that it can run without the host waiting and the decode step after it can be queued."""
        return bool(batch.items) and all(seq.num_uncomputed_tokens == n for seq, n in batch.items)

    def _ends_by_length(self, seq: Sequence) -> bool:
        """Whether the token now being sampled for `seq` is certainly its last, whatever its value."""
        return seq.num_output_tokens + 1 >= seq.params.max_tokens or len(seq) + 1 >= self.engine.max_model_len

    def _next_rows(self, flight: InFlightStep) -> list[tuple[int, Sequence]]:
        """The decode rows of the step after `flight` (its row in `flight`, sequence) when that step can be
        queued now: every running sequence decodes in it, as the scheduler would choose once `flight`'s tokens
        were in, less the rows that stop (waiting requests are admitted beside them, `_launch_next`); empty
        when the next step must wait for the tokens and be scheduled."""
        sched, bm = self.engine.scheduler, self.engine.block_manager
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
        engine = self.engine
        seqs = [seq for _, seq in rows]
        for seq in seqs:
            engine.block_manager.grow(seq, seq.num_computed_tokens + 1)
        admitted = engine.scheduler.admit_beside_decodes(len(seqs)) if engine.scheduler.waiting else []
        step = lookahead_inputs(seqs, engine.block_size, admitted)
        logits = engine.runner.run(step, gather=(flight.tokens, [row for row, _ in rows]))
        for seq in seqs:
            seq.num_computed_tokens += 1  # its blocks register once the token at that position is known
        for seq, n in admitted:
            seq.num_computed_tokens += n
            engine.block_manager.register_full_blocks(seq)
        self.num_overlapped_steps += 1
        self.num_overlapped_admissions += len(admitted)
        # `flight`'s tokens are not appended to the decoding sequences yet
        pending = [1] * len(seqs) + [0] * (len(step.sample_seqs) - len(seqs))
        return self._sample(step.sample_seqs, logits, pending)

    def _sample(
        self, seqs: list[Sequence], logits: torch.Tensor, pending: list[int] | None = None
    ) -> InFlightStep:
        """Sample on the device and start the copy of the tokens to the host, without waiting for either."""
        sampler = self.engine.sampler
        tokens = sampler.choose(logits, seqs, pending)
        wanted = [i for i, seq in enumerate(seqs) if seq.params.logprobs]
        logprobs = sampler.logprobs(logits, tokens, wanted) if wanted else None
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
        engine = self.engine
        outputs = []
        tokens, logprobs = flight.results()
        for row, (seq, token) in enumerate(zip(flight.seqs, tokens, strict=True)):
            if seq.status is not Status.RUNNING:
                continue
            if row in logprobs:
                seq.logprobs.append(logprobs[row])
            outputs.append(engine.append_token(seq, token))
            if seq.status is Status.RUNNING:
                engine.block_manager.register_full_blocks(seq)
        return outputs
