"""Token choice outside the model (and outside any CUDA graph): greedy, temperature, top-k, top-p, seeds.

Random rows draw with the exponential-race trick, argmax(p / q) with q ~ Exp(1), which samples exactly from p.
A request with its own seed draws q from its own generator, so its tokens do not depend on what else shares
the batch; the rest draw from the engine's generator.
"""

from __future__ import annotations

import torch

from reference_engine.host_copy import to_device
from reference_engine.sequence import Sequence


class Sampler:
    def __init__(self, eos_token_ids: tuple[int, ...], device: torch.device, seed: int) -> None:
        self.eos_token_ids = list(eos_token_ids)
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def stop_ids(self, seq: Sequence) -> list[int]:
        """Tokens that end this request (and that min_tokens therefore forbids early)."""
        ids = list(seq.params.stop_token_ids)
        if not seq.params.ignore_eos:
            ids += self.eos_token_ids
        return ids

    def __call__(self, logits: torch.Tensor, seqs: list[Sequence]) -> list[int]:
        """One token per row of `logits` ([len(seqs), vocab], float32); records logprobs where asked."""
        chosen = self.choose(logits, seqs)
        wanted = [i for i, seq in enumerate(seqs) if seq.params.logprobs]
        if wanted:
            for i, value in zip(wanted, self.logprobs(logits, chosen, wanted).tolist(), strict=True):
                seqs[i].logprobs.append(value)
        return chosen.tolist()

    def logprobs(self, logits: torch.Tensor, chosen: torch.Tensor, rows: list[int]) -> torch.Tensor:
        """Log-probabilities of the chosen tokens of `rows` under the raw logits, on the device."""
        index = to_device(rows, logits.device, torch.long)
        picked = chosen.index_select(0, index)
        return logits.index_select(0, index).log_softmax(dim=-1).gather(1, picked[:, None]).squeeze(1)

    def choose(
        self, logits: torch.Tensor, seqs: list[Sequence], pending: list[int] | None = None
    ) -> torch.Tensor:
        """The chosen tokens as a tensor on the logits' device, so that a caller can use them there
        without waiting for the device (overlapped decode feeds them to the next step). `pending`: per row,
        tokens already chosen but not yet appended to its sequence (1 for a decode queued behind the step in
        flight), so that min_tokens bans stop tokens up to the right position."""
        pending = pending or [0] * len(seqs)
        bans = [
            (row, banned)
            for row, (seq, ahead) in enumerate(zip(seqs, pending, strict=True))
            if seq.num_output_tokens + ahead < seq.params.min_tokens and (banned := self.stop_ids(seq))
        ]
        if bans:
            logits = logits.clone()  # the caller's logits stay raw, for logprobs
            for row, banned in bans:
                logits[row].index_fill_(0, to_device(banned, logits.device, torch.long), float("-inf"))
        greedy = [seq.params.greedy for seq in seqs]
        tokens = logits.argmax(dim=-1)
        if all(greedy):
            return tokens
        rows = to_device([i for i, g in enumerate(greedy) if not g], logits.device, torch.long)
        picked = [seq for seq, g in zip(seqs, greedy, strict=True) if not g]
        tokens.index_copy_(0, rows, self._sample(logits.index_select(0, rows), picked))
        return tokens

    def _sample(self, logits: torch.Tensor, seqs: list[Sequence]) -> torch.Tensor:
        device = logits.device
        temperature = to_device([s.params.temperature for s in seqs], device, logits.dtype)
        logits = logits / temperature[:, None]
        top_k = [s.params.top_k for s in seqs]
        top_p = [s.params.top_p for s in seqs]
        if any(top_k) or any(p < 1.0 for p in top_p):
            logits = _top_k_top_p(logits, top_k, top_p)
        probs = logits.softmax(dim=-1)
        shared = [i for i, s in enumerate(seqs) if s.generator is None]
        draws = (
            torch.empty(len(shared), probs.shape[1], device=device).exponential_(generator=self.generator)
            if shared
            else None
        )
        if len(shared) == len(seqs):
            q = draws
        else:
            q = torch.empty_like(probs)
            if shared:
                q.index_copy_(0, to_device(shared, device, torch.long), draws)
        for i, seq in enumerate(seqs):
            if seq.generator is not None:
                q[i].exponential_(generator=seq.generator)
        return (probs / q).argmax(dim=-1)


def _top_k_top_p(logits: torch.Tensor, top_k: list[int], top_p: list[float]) -> torch.Tensor:
    """Mask everything outside each row's top-k, then outside the smallest set whose mass reaches top-p."""
    vocab = logits.shape[1]
    sorted_logits, order = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(vocab, device=logits.device)
    k = to_device([t if t > 0 else vocab for t in top_k], logits.device, torch.long)
    sorted_logits = sorted_logits.masked_fill(ranks[None, :] >= k[:, None], float("-inf"))
    p = to_device(top_p, logits.device, logits.dtype)
    sorted_probs = sorted_logits.softmax(dim=-1)
    mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_logits = sorted_logits.masked_fill(mass_before >= p[:, None], float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter(1, order, sorted_logits)
