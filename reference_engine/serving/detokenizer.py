"""Incremental detokenisation with stop strings, one text delta per generated token.

A token that ends inside a multi-byte character yields an empty delta (as vLLM streams it); the character
appears with the token that completes it. While stop strings are active, the last (longest stop - 1)
characters are held back so that a stop string split across tokens is never streamed.
"""

from __future__ import annotations

from tokenizers.decoders import DecodeStream
from transformers import PreTrainedTokenizerBase

PROMPT_CONTEXT_TOKENS = 6  # prompt tokens fed first, so a first output token's leading space decodes right


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_ids: list[int],
        stop: list[str] | None = None,
        skip_special_tokens: bool = True,
        include_stop_str_in_output: bool = False,
    ) -> None:
        self._backend = tokenizer.backend_tokenizer
        self._stream = DecodeStream(
            ids=prompt_ids[-PROMPT_CONTEXT_TOKENS:], skip_special_tokens=skip_special_tokens
        )
        self._stops = [s for s in (stop or []) if s]
        self._hold = max((len(s) for s in self._stops), default=1) - 1
        self._include_stop = include_stop_str_in_output
        self.text = ""
        self._sent = 0
        self.stop_string: str | None = None  # the stop string that ended the text, once one has

    def add(self, token_id: int) -> None:
        """Feed one generated token; after a stop string matched, further tokens are ignored."""
        if self.stop_string is not None:
            return
        piece = self._stream.step(self._backend, token_id) or ""
        if not piece:
            return
        search_from = max(0, len(self.text) - self._hold)
        self.text += piece
        for stop in self._stops:
            at = self.text.find(stop, search_from)
            if at != -1:
                self.text = self.text[: at + len(stop)] if self._include_stop else self.text[:at]
                self.stop_string = stop
                break

    def delta(self, finished: bool) -> str:
        """Text not yet returned, minus what a stop string might still claim (unless the request finished)."""
        end = (
            len(self.text)
            if finished or self.stop_string is not None
            else max(self._sent, len(self.text) - self._hold)
        )
        out = self.text[self._sent : end]
        self._sent = end
        return out
