"""One module per serving backend: how to talk to it and read its stream (and, later, start it).

from adapters import get_adapter
adapter = get_adapter("vllm", model="my-model")
"""

from __future__ import annotations

from typing import Any

from adapters.base import Adapter, HttpRequest, MalformedEvent, StreamEvent, Usage
from adapters.llamacpp import LlamaCppChatAdapter, LlamaCppCompletionsAdapter
from adapters.openai import OpenAIChatAdapter, OpenAICompletionsAdapter
from adapters.reference import ReferenceAdapter, ReferenceChatAdapter, ReferenceTGIAdapter
from adapters.tgi import TGIAdapter, TGIOpenAIChatAdapter, TGIOpenAICompletionsAdapter
from adapters.trtllm import TritonGenerateAdapter, TrtllmChatAdapter, TrtllmCompletionsAdapter
from adapters.vllm import VLLMChatAdapter, VLLMCompletionsAdapter

ADAPTERS: dict[str, type[Adapter]] = {
    cls.name: cls
    for cls in (
        OpenAICompletionsAdapter,
        OpenAIChatAdapter,
        VLLMCompletionsAdapter,
        VLLMChatAdapter,
        TGIAdapter,
        TGIOpenAIChatAdapter,
        TGIOpenAICompletionsAdapter,
        TrtllmCompletionsAdapter,
        TrtllmChatAdapter,
        TritonGenerateAdapter,
        ReferenceAdapter,
        ReferenceChatAdapter,
        ReferenceTGIAdapter,
        LlamaCppCompletionsAdapter,
        LlamaCppChatAdapter,
    )
}


def get_adapter(name: str, **options: Any) -> Adapter:
    """The adapter registered under `name`, built with `options` (see each class for its options)."""
    try:
        cls = ADAPTERS[name]
    except KeyError:
        raise ValueError(f"unknown adapter {name!r}; known: {', '.join(sorted(ADAPTERS))}") from None
    return cls(**options)


__all__ = ["ADAPTERS", "Adapter", "HttpRequest", "MalformedEvent", "StreamEvent", "Usage", "get_adapter"]
