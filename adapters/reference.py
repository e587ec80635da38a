"""Our reference engine's server. It speaks the OpenAI protocol byte-compatible with vLLM (completions by
default, chat as `reference-chat`) and the TGI protocol byte-compatible with TGI's router (`reference-tgi`),
so it is read exactly as those are. Its Prometheus names are expected to follow vLLM's; if the server
exports its own names, this map is the one place to change.
"""

from __future__ import annotations

from adapters.tgi import TGIAdapter
from adapters.vllm import VLLM_METRICS, VLLMChatAdapter, VLLMCompletionsAdapter

REFERENCE_METRICS = dict(VLLM_METRICS)


class ReferenceAdapter(VLLMCompletionsAdapter):
    name = "reference"
    metric_names = REFERENCE_METRICS


class ReferenceChatAdapter(VLLMChatAdapter):
    name = "reference-chat"
    metric_names = REFERENCE_METRICS


class ReferenceTGIAdapter(TGIAdapter):
    name = "reference-tgi"
    metric_names = REFERENCE_METRICS
