"""Serving settings given alike to the launched backends (`--match-serving`, on by default), so that a
comparison of engines is not one of their deployments: HTTP front-end (API-server) processes, the most
sequences in a batch, and the batch token budget, wherever every launched server of a family that can set
them (ours and vLLM, whose flags share their names) runs.

The rule, per setting: a value one candidate was given on purpose (its variant or `--server-args`) is never
changed; where every such value agrees, the other engines' candidates get it too (another variant of the
engine that set it keeps its default: variants of one engine differ as they say); where they disagree,
nothing is matched and the report says so. Where none was given:

- HTTP front ends: the largest default on this machine (ours: 4 with an NVIDIA GPU and 16 or more cores,
  else 1; vLLM: 1, one per data-parallel rank). Holding a backend below what it would run with by default
  would make the comparison one of its handicap; vLLM serves with several API-server processes itself
  (`--api-server-count`, the same SO_REUSEPORT scheme), so the larger count is one a deployment on this
  machine would choose for either.
- Max concurrent sequences and batch token budget: ours' documented defaults for the device (256 and
  8192 tokens on a GPU, 64 and 2048 on a CPU). vLLM's own defaults change with its version and the GPU's
  memory (1024 sequences on an H200 in recent versions), so left alone they would be an unknown
  difference; stated alike they are a known equality.

TGI and TensorRT-LLM have batch limits of their own meaning (a padded batch, an engine's build limit) and
no front-end count: they are not matched, and the report lists them. The outcome of each setting is kept
in the manifest (`serving_match`) and shown under the report's parity table.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from adapters.base import Adapter
from adapters.launch_spec import LaunchSpec
from adapters.reference import reference_serving_defaults
from compare.launch.declared import setting_flags

if TYPE_CHECKING:
    from compare.analysis.parity import Declared

#: the settings matched, with their labels (as `compare.analysis.parity` names them)
MATCHED = {
    "api_servers": "HTTP front ends",
    "max_num_seqs": "max concurrent sequences",
    "max_batched_tokens": "batch token budget",
}
#: one launch as the match sees it: its backend key, its adapter class and its launch spec as planned
Launch = tuple[str, type[Adapter], LaunchSpec]


@dataclass
class MatchedSetting:
    """One setting's outcome: the value given (None: not matched), why, which launches got it as a flag,
    which kept a value of their own, and which could not be given it."""

    setting: str
    value: int | None = None
    rule: str = ""
    given: list[str] = field(default_factory=list)
    kept: dict[str, int] = field(default_factory=dict)
    cannot: dict[str, str] = field(default_factory=dict)


def _explicit(cls: type[Adapter], spec: LaunchSpec, setting: str) -> int | None:
    """The value a launch spec already sets (the last of the adapter's flags for it), else None."""
    value = setting_flags(cls, spec.command).get(setting)
    if value is None and setting == "api_servers" and "--no-engine-process" in spec.command:
        return 1  # our server in one process has one front end
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def _reference_batch_defaults(gpu: bool) -> dict[str, int]:
    return {k: v for k, v in reference_serving_defaults(gpu).items() if k != "api_servers"}


def plan_match(launches: list[Launch], gpu: bool) -> dict[str, MatchedSetting]:
    """Each matched setting's outcome for the launched backends (`key`, adapter class, launch spec as
    planned, before matching), by the module docstring's rule; those whose adapters are
    `serving_matchable` can be given them."""
    out = {}
    for setting in MATCHED:
        m = MatchedSetting(setting)
        can = [(key, cls, spec) for key, cls, spec in launches if cls.serving_matchable]
        for key, cls, _ in launches:
            if not cls.serving_matchable:
                m.cannot[key] = f"{cls.server_family}: no flag of the same meaning as ours' and vLLM's"
        explicit = {key: v for key, cls, spec in can if (v := _explicit(cls, spec, setting)) is not None}
        m.kept = explicit
        if len(can) < 2:
            m.rule = "fewer than two launched backends can set it"
        elif len({cls.server_family for _, cls, _ in can}) < 2:
            m.rule = "one engine: its candidates differ only as their variants say"
        elif len(set(explicit.values())) > 1:
            m.rule = "the candidates were given different values on purpose"
        elif explicit:
            m.value, m.rule = next(iter(explicit.values())), "the value one candidate was given"
        elif setting == "api_servers":
            m.value = max(cls.serving_defaults(gpu).get(setting, 1) for _, cls, _ in can)
            m.rule = "the largest default among them on this machine"
        else:
            m.value = _reference_batch_defaults(gpu)[setting]
            m.rule = f"the reference engine's default on {'a GPU' if gpu else 'a CPU'}"
        if m.value is not None:  # as a flag even where it is the default: the command then says so
            chosen = {cls.server_family for key, cls, _ in can if key in explicit}
            m.given = [key for key, cls, _ in can if key not in explicit and cls.server_family not in chosen]
        out[setting] = m
    return out


def apply_match(
    spec: LaunchSpec, cls: type[Adapter], key: str, matched: dict[str, MatchedSetting]
) -> LaunchSpec:
    """The launch spec with the matched values its backend is to be given as flags."""
    extra: list[str] = []
    for setting, m in matched.items():
        if key in m.given and m.value is not None:
            extra += [cls.setting_flags[setting][0], str(m.value)]
    return spec.with_extra_args(extra) if extra else spec


def record(manifest: dict[str, Any], matched: dict[str, MatchedSetting]) -> None:
    """Into the manifest, for the report."""
    manifest["serving_match"] = {name: asdict(m) for name, m in matched.items()}


def serving_match_lines(manifest: dict[str, Any], declared: dict[str, Declared]) -> list[str]:
    """The report's lines on matching: what each setting was given and what could not be matched; for a
    run without matching, where backends differ on a setting it would have matched."""
    config = manifest.get("config") or {}
    recorded = manifest.get("serving_match")
    lines = []
    if not recorded:
        if config.get("match_serving") is False:
            unequal = [
                label
                for name, label in MATCHED.items()
                if len({getattr(d, name) for d in declared.values() if getattr(d, name) is not None}) > 1
            ]
            if unequal:
                lines.append(f"Not matched: --as-given was given ({', '.join(unequal)} differ).")
        return lines
    for name, m in recorded.items():
        if m.get("value") is None and not m.get("cannot") and "different values" not in str(m.get("rule")):
            continue  # one launched engine: nothing to match, nothing to say
        label = MATCHED.get(name, name)
        kept = ", ".join(f"{k} {v}" for k, v in (m.get("kept") or {}).items())
        if m.get("value") is not None:
            given = ", ".join(m.get("given") or []) or "none needed it as a flag"
            text = f"{label}: {m['value']} ({m.get('rule')}); given as a flag to {given}"
            text += f"; set by the candidate: {kept}." if kept else "."
        else:
            text = f"{label}: not matched, {m.get('rule')}" + (f" ({kept})." if kept else ".")
        cannot = m.get("cannot") or {}
        if cannot:
            text += " Could not be matched: " + "; ".join(f"{k} ({why})" for k, why in cannot.items()) + "."
        lines.append(text)
    return lines
