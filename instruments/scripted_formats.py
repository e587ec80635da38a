"""The bytes the scripted server writes: each backend's documented stream shapes, event by event.

Shapes follow the sources the adapters cite: vLLM (`serving_completion.py`, `serving_chat.py`: chunks
dumped with `exclude_unset`, role-only first chat chunk, usage `prompt_tokens,total_tokens,
completion_tokens`, final usage-only chunk, `data: [DONE]`), TensorRT-LLM's `trtllm-serve`
(`postprocess_handlers.py`: completion chunks with every field, chat chunks without null fields, a space
before the first chat chunk's blank line, `prompt_tokens_details` in usage), TGI's router (`data:` without
a space, one event per token, `details` on the last, OpenAI chunks that repeat the role) and Triton's
generate extension (`text_output` per step, no end marker).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

Flavor = Literal["vllm", "trtllm", "tgi"]
Protocol = Literal["completions", "chat", "tgi", "triton"]


# The request fields trtllm-serve's pydantic models accept (`openai_protocol.py`: CompletionRequest,
# ChatCompletionRequest; any other field is refused with a 400). Written out here, not imported from the
# TensorRT-LLM adapter, so that the server checks the adapter's own list instead of agreeing with it.
_TRTLLM_SHARED_FIELDS = frozenset(
    {
        "model", "best_of", "echo", "frequency_penalty", "logit_bias", "logprobs", "n", "presence_penalty",
        "seed", "stop", "stream", "stream_options", "temperature", "top_p", "user", "lora_request",
        "prompt_ignore_length", "use_beam_search", "top_k", "top_p_min", "min_p", "repetition_penalty",
        "length_penalty", "early_stopping", "stop_token_ids", "include_stop_str_in_output", "ignore_eos",
        "min_tokens", "skip_special_tokens", "spaces_between_special_tokens", "truncate_prompt_tokens",
        "add_special_tokens", "response_format", "disaggregated_params", "priority", "conversation_params",
        "thinking_token_budget",
    }
)  # fmt: skip
TRTLLM_ACCEPTED_FIELDS: dict[str, frozenset[str]] = {
    "completions": _TRTLLM_SHARED_FIELDS
    | {"prompt", "max_tokens", "suffix", "return_context_logits", "detokenize"},
    "chat": _TRTLLM_SHARED_FIELDS
    | {
        "messages", "prompt_token_ids", "max_tokens", "max_completion_tokens", "top_logprobs", "tools",
        "tool_choice", "parallel_tool_calls", "reasoning_effort", "thinking", "add_generation_prompt",
        "documents", "chat_template", "chat_template_kwargs", "media_io_kwargs", "cache_salt",
        "agent_hierarchy", "mm_processor_kwargs",
    },
}  # fmt: skip


def _dump(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class StreamFormat:
    """Renders one response's events for a flavor and protocol; `prompt_tokens` feeds usage fields."""

    flavor: Flavor
    protocol: Protocol
    model: str
    request_id: str
    created: int
    prompt_tokens: int

    @property
    def prefix(self) -> bytes:
        return b"data:" if self.flavor == "tgi" and self.protocol != "triton" else b"data: "

    def event(self, payload: bytes, tail: bytes = b"\n\n") -> bytes:
        return self.prefix + payload + tail

    # -- OpenAI-shaped streams -------------------------------------------------------------------------

    def _usage(self, completion: int) -> dict[str, Any]:
        if self.flavor == "tgi":
            return {
                "prompt_tokens": self.prompt_tokens,
                "completion_tokens": completion,
                "total_tokens": self.prompt_tokens + completion,
            }
        usage: dict[str, Any] = {
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "completion_tokens": completion,
        }
        if self.flavor == "trtllm":
            usage["prompt_tokens_details"] = {"cached_tokens": 0}
        return usage

    def _head(self) -> dict[str, Any]:
        chat = self.protocol == "chat"
        if self.flavor == "tgi":
            return {
                "object": "chat.completion.chunk" if chat else "text_completion",
                "id": "",
                "created": self.created,
                "model": self.model,
                "system_fingerprint": "3.0.1-scripted",
            }
        return {
            "id": ("chatcmpl-" if chat else "cmpl-") + self.request_id,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": self.created,
            "model": self.model,
        }

    def role(self, continuous: bool) -> bytes:
        """vLLM's and TensorRT-LLM's role-only first chat chunk."""
        head = self._head()
        if self.flavor == "trtllm":
            chunk = {**head, "choices": [{"index": 0, "delta": {"role": "assistant"}}]}
            if continuous:
                chunk["usage"] = self._usage(0)
            return self.event(_dump(chunk), b" \n\n")
        chunk = {
            **head,
            "choices": [
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            ],
        }
        if continuous:
            chunk["usage"] = self._usage(0)
        return self.event(_dump(chunk))

    def tokens(
        self, texts: list[str], finish: str | None, generated: int, continuous: bool, full_text: str = ""
    ) -> bytes:
        """One decoding step of `len(texts)` tokens, `generated` tokens so far including them: one chunk
        (vLLM, TensorRT-LLM, Triton) or one event per token (TGI streams token by token, also on its OpenAI
        routes). `continuous` puts cumulative usage on the chunk."""
        if self.protocol == "tgi" or self.flavor == "tgi":
            first = generated - len(texts)
            return b"".join(
                self._tgi_token(
                    texts[i],
                    1000 + first + i,
                    finish if i == len(texts) - 1 else None,
                    first + i + 1,
                    full_text,
                )
                for i in range(len(texts))
            )
        text = "".join(texts)
        if self.protocol == "triton":
            return self.event(
                _dump(
                    {
                        "model_name": self.model,
                        "model_version": "1",
                        "sequence_end": False,
                        "sequence_id": 0,
                        "sequence_start": False,
                        "text_output": text,
                    }
                )
            )
        if self.protocol == "chat":
            if self.flavor == "trtllm":
                choice: dict[str, Any] = {"index": 0, "delta": {"content": text, "reasoning_content": ""}}
                if finish is not None:
                    choice["finish_reason"] = finish
            else:
                choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
                if finish is not None:
                    choice["stop_reason"] = None
        elif self.flavor == "trtllm":
            choice = {
                "index": 0,
                "text": text,
                "token_ids": None,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
                "avg_decoded_tokens_per_iter": None,
            }
        else:
            choice = {
                "index": 0,
                "text": text,
                "logprobs": None,
                "finish_reason": finish,
                "stop_reason": None,
            }
        chunk = {**self._head(), "choices": [choice]}
        if continuous:
            chunk["usage"] = self._usage(generated)
        elif self.flavor == "trtllm" and self.protocol == "completions":
            chunk["usage"] = None
        return self.event(_dump(chunk))

    def _tgi_token(
        self, text: str, token_id: int, finish: str | None, generated: int, full_text: str
    ) -> bytes:
        if self.protocol == "tgi":
            token = {"id": token_id, "text": text, "logprob": -0.25, "special": False}
            event: dict[str, Any] = {
                "index": generated,
                "token": token,
                "generated_text": None,
                "details": None,
            }
            if finish is not None:
                event["generated_text"] = full_text
                event["details"] = {
                    "finish_reason": finish,
                    "generated_tokens": generated,
                    "seed": None,
                    "input_length": self.prompt_tokens,
                }
            return self.event(_dump(event))
        head = self._head()
        if self.protocol == "chat":
            choice = {
                "index": 0,
                "delta": {"role": "assistant", "content": text},
                "logprobs": None,
                "finish_reason": finish,
            }
            return self.event(_dump({**head, "choices": [choice], "usage": None}))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish or ""}
        if finish is None:
            chunk = {
                "object": head["object"],
                "id": "",
                "created": self.created,
                "choices": [choice],
                "model": self.model,
                "system_fingerprint": head["system_fingerprint"],
            }
        else:
            chunk = {**head, "choices": [choice], "usage": self._usage(generated)}
        return self.event(_dump(chunk))

    def final_usage(self, completion: int) -> bytes:
        head = self._head()
        chunk = {**head, "choices": [], "usage": self._usage(completion)}
        return self.event(_dump(chunk))

    def done(self) -> bytes:
        return self.event(b"[DONE]")

    def error(self, message: str) -> bytes:
        if self.flavor == "tgi" or self.protocol == "tgi":
            return self.event(_dump({"error": message, "error_type": "generation"}))
        if self.protocol == "triton":
            return self.event(_dump({"error": message}))
        error = {
            "object": "error",
            "message": message,
            "type": "InternalServerError",
            "param": None,
            "code": 500,
        }
        return self.event(_dump({"error": error}))

    def malformed(self) -> bytes:
        return self.event(b'{"id": "broken", "choices": [{"index": 0, "text": "unterminated')


def error_body(flavor: Flavor, protocol: Protocol, status: int, message: str) -> bytes:
    """A JSON error body as the backend would send it with a non-200 status."""
    if flavor == "tgi" or protocol == "tgi":
        return _dump({"error": message, "error_type": "overloaded" if status == 429 else "generation"})
    if protocol == "triton":
        return _dump({"error": message})
    return _dump(
        {
            "object": "error",
            "message": message,
            "type": "BadRequestError" if status < 500 else "InternalServerError",
            "param": None,
            "code": status,
        }
    )
