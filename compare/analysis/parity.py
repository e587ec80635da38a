"""Parity of the compared backends: what each declares of itself, side by side, and the settings on which
they differ. The model's side: context length, dtype, quantisation, tokenizer, whether it honoured the
forced output length. The serving side: HTTP front-end (API-server) processes, max concurrent sequences,
the batch token budget, chunked prefill, speculative decoding, KV-cache dtype, tensor and pipeline
parallel, GPU memory fraction, prefix caching, CUDA graphs, the KV block size (shown only: a page size is
the kernel's choice, not a serving limit).

A comparison is only of backends when the settings are equal; where they differ, part of a difference in
latency or throughput may be the setting's. The report shows the table and flags each difference; the decision
says when its winner and runner-up differ. An unknown value is shown as unknown and never counts as a
difference: only two known values can disagree. Pure: the values come from
`compare.analysis.declared_settings`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

#: one setting's value as `Declared` holds it (None: not known)
Value = str | int | float | bool | None


@dataclass(frozen=True)
class Declared:
    """What one backend declares of itself; None where it is not known. `sources` names where each value
    came from (`models route`, `log`, `command`, `default`, `variant`, `records`)."""

    served_model: str | None = None
    max_model_len: int | None = None
    dtype: str | None = None
    quantization: str | None = None
    prefix_caching: bool | None = None
    cuda_graphs: bool | None = None
    tokenizer: str | None = None  # `sha256:<hex>` of its files, or `name:<path or hub id>`
    forced_length: bool | None = None  # every forced output came back at the length asked for
    api_servers: int | None = None  # HTTP front-end processes serving the port
    max_num_seqs: int | None = None  # the most sequences in one batch (requests served at once)
    max_batched_tokens: int | None = None  # tokens one step may carry, prompt chunks included
    chunked_prefill: bool | None = None
    speculative: str | None = None  # `none`, or the method (ngram, eagle, a draft model)
    kv_cache_dtype: str | None = None  # `auto`: the model's dtype
    tensor_parallel: int | None = None
    pipeline_parallel: int | None = None
    gpu_memory_utilization: float | None = None
    block_size: int | None = None  # KV-cache tokens per block
    sources: Mapping[str, str] = field(default_factory=dict)
    unknown: Mapping[str, str] = field(default_factory=dict)  # why a value is unknown, where it is known why


@dataclass(frozen=True)
class Setting:
    """One audited setting: its `Declared` field, how the report names it and writes its values, and
    whether backends must agree on it (a served model name is the operator's choice, shown only)."""

    name: str
    label: str
    on: str = "on"
    off: str = "off"
    compared: bool = True

    def show(self, value: Value) -> str:
        if value is None:
            return "unknown"
        if isinstance(value, bool):
            return self.on if value else self.off
        return str(value)


SETTINGS: tuple[Setting, ...] = (
    Setting("served_model", "served model", compared=False),
    Setting("max_model_len", "max model length"),
    Setting("dtype", "dtype"),
    Setting("quantization", "quantisation"),
    Setting("prefix_caching", "prefix caching"),
    Setting("cuda_graphs", "CUDA graphs"),
    Setting("tokenizer", "tokenizer"),
    Setting("forced_length", "forced output length", on="honoured", off="short outputs"),
    Setting("api_servers", "HTTP front ends"),
    Setting("max_num_seqs", "max concurrent sequences"),
    Setting("max_batched_tokens", "batch token budget"),
    Setting("chunked_prefill", "chunked prefill"),
    Setting("speculative", "speculative decoding"),
    Setting("kv_cache_dtype", "KV-cache dtype"),
    Setting("tensor_parallel", "tensor parallel"),
    Setting("pipeline_parallel", "pipeline parallel"),
    Setting("gpu_memory_utilization", "GPU memory fraction"),
    Setting("block_size", "KV block size", compared=False),
)
SETTING = {s.name: s for s in SETTINGS}


@dataclass(frozen=True)
class Finding:
    """One setting on which two or more backends declare different known values: `name` is the setting's
    (a `Declared` field), `sentence()` the short sentence that says so (`Unequal HTTP front ends: ...`)."""

    setting: Setting
    values: dict[str, Value]  # backend key -> its known value

    @property
    def name(self) -> str:
        return self.setting.name

    @property
    def label(self) -> str:
        return self.setting.label

    def sentence(self) -> str:
        shown = ", ".join(f"{key} {self.setting.show(v)}" for key, v in self.values.items())
        return f"Unequal {self.setting.label}: {shown}."


def comparable(setting: Setting, a: Value, b: Value) -> bool:
    """Whether two known values can be told apart: a tokenizer's file hash and another's name cannot."""
    if setting.name == "tokenizer":
        return str(a).split(":", 1)[0] == str(b).split(":", 1)[0]
    return True


def differs(setting: Setting, a: Value, b: Value) -> bool:
    return a is not None and b is not None and comparable(setting, a, b) and a != b


def findings(declared: Mapping[str, Declared]) -> list[Finding]:
    """Each compared setting on which some two backends' known, comparable values differ."""
    out = []
    for setting in SETTINGS:
        if not setting.compared:
            continue
        known = {key: getattr(d, setting.name) for key, d in declared.items()}
        known = {key: v for key, v in known.items() if v is not None}
        values = list(known.values())
        if any(differs(setting, a, b) for i, a in enumerate(values) for b in values[i + 1 :]):
            out.append(Finding(setting, known))
    return out


def parity_table(declared: Mapping[str, Declared]) -> tuple[list[str], list[list[str]]]:
    """One row per setting, one column per backend (settings outnumber backends); a value on which backends
    differ is flagged `⚠`, a known value says where it came from, an unknown one why where that is known."""
    flagged = {f.setting.name for f in findings(declared)}
    header = ["setting", *declared]
    rows = []
    for s in SETTINGS:
        cells = [s.label]
        for d in declared.values():
            cells.append(cell(s, d, s.name in flagged))
        rows.append(cells)
    return header, rows


def cell(setting: Setting, d: Declared, flagged: bool = False) -> str:
    """One backend's value of a setting as the table writes it."""
    value = getattr(d, setting.name)
    if value is None:
        why = d.unknown.get(setting.name)
        return f"unknown ({why})" if why else "unknown"
    text = setting.show(value)
    if setting.name == "tokenizer":
        text = _short_tokenizer(str(value))
    if flagged:
        text = f"⚠ **{text}**"
    source = d.sources.get(setting.name)
    return f"{text} ({source})" if source else text


def _short_tokenizer(value: str) -> str:
    kind, _, rest = value.partition(":")
    return f"sha256 {rest[:12]}" if kind == "sha256" else rest
