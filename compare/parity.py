"""Parity of the compared backends: what each declares of itself (context length, dtype, quantisation,
prefix caching, CUDA graphs, tokenizer, whether it honoured the forced output length), side by side, and the
settings on which they differ.

A comparison is only of backends when the settings are equal; where they differ, part of a difference in
latency or throughput may be the setting's. The report shows the table and flags each difference; the
decision says when its winner and runner-up differ. An unknown value is shown as unknown and never counts as
a difference: only two known values can disagree. Pure: the values come from `compare.declared`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


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
    sources: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Setting:
    """One audited setting: its `Declared` field, how the report names it and writes its values, and
    whether backends must agree on it (a served model name is the operator's choice, shown only)."""

    name: str
    label: str
    on: str = "on"
    off: str = "off"
    compared: bool = True

    def show(self, value: Any) -> str:
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
)


@dataclass(frozen=True)
class Finding:
    """One setting on which two or more backends declare different known values."""

    setting: Setting
    values: dict[str, Any]  # backend key -> its known value

    def sentence(self) -> str:
        shown = ", ".join(f"{key} {self.setting.show(v)}" for key, v in self.values.items())
        return f"Unequal {self.setting.label}: {shown}."


def comparable(setting: Setting, a: Any, b: Any) -> bool:
    """Whether two known values can be told apart: a tokenizer's file hash and another's name cannot."""
    if setting.name == "tokenizer":
        return str(a).split(":", 1)[0] == str(b).split(":", 1)[0]
    return True


def differs(setting: Setting, a: Any, b: Any) -> bool:
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


def differences(a: Declared, b: Declared) -> list[str]:
    """The settings two backends differ on, each as `label value against value`."""
    return [
        f"{s.label} {s.show(getattr(a, s.name))} against {s.show(getattr(b, s.name))}"
        for s in SETTINGS
        if s.compared and differs(s, getattr(a, s.name), getattr(b, s.name))
    ]


def parity_table(declared: Mapping[str, Declared]) -> tuple[list[str], list[list[str]]]:
    """One row per backend, one column per setting; a value on which backends differ is flagged `⚠`."""
    flagged = {f.setting.name for f in findings(declared)}
    header = ["backend", *(s.label for s in SETTINGS)]
    rows = []
    for key, d in declared.items():
        cells = [key]
        for s in SETTINGS:
            value = getattr(d, s.name)
            text = s.show(value)
            if s.name == "tokenizer" and value is not None:
                text = _short_tokenizer(str(value))
            if s.name in flagged and value is not None:
                text = f"⚠ **{text}**"
            source = d.sources.get(s.name)
            cells.append(f"{text} ({source})" if source and value is not None else text)
        rows.append(cells)
    return header, rows


def _short_tokenizer(value: str) -> str:
    kind, _, rest = value.partition(":")
    return f"sha256 {rest[:12]}" if kind == "sha256" else rest
