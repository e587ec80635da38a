"""Imported points (`compare import`) set against ours in the same workload: their model, mean prompt and
output lengths and load beside ours. One on another model, or with a mean length off by more than
`LENGTH_TOLERANCE`, measured another workload: it is dropped from what the selection ranks, and the report
says why."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pandas as pd

#: how far an imported point's mean prompt or output length may be from ours (as a ratio either way) and
#: still be ranked against it: a random dataset's lengths vary by tokenizer and sampling, not by 2x
LENGTH_TOLERANCE = 1.25


@dataclass
class ImportParity:
    """The parity rows of imported points against ours (header and rows for a table), the summary indices
    that must not be ranked, and a sentence for each."""

    header: list[str]
    rows: list[list[str]]
    excluded: list[Any]
    sentences: list[str]


def model_name(text: str | None) -> str:
    """A model's name for comparison: the last part of a path or hub id, lower-case, letters and digits
    only (`/tmp/ckpt-llama-3.2-1b` and `meta-llama/Llama-3.2-1B` share `llama321b`)."""
    last = str(text or "").rstrip("/").rsplit("/", 1)[-1].lower()
    return "".join(ch for ch in last if ch.isalnum())


def same_model(a: str | None, b: str | None) -> bool | None:
    """Whether two names name one model (None: one is unknown): the same name, or one holding the other
    (a checkpoint folder named after its hub id) where the shorter is long enough to mean something."""
    x, y = model_name(a), model_name(b)
    if not x or not y:
        return None
    short, long = sorted((x, y), key=len)
    return short == long or (len(short) >= 4 and short in long)


def _names_agree(theirs: list[str | None], ours: list[str | None]) -> bool | None:
    """Whether any of an imported file's names (served model, tokenizer) names one of ours (model, served
    name, tokenizer): a server may be asked for a model by any name, so one agreement is enough; None
    where no pair of names is known."""
    verdicts = [same_model(a, b) for a in theirs for b in ours]
    known = [v for v in verdicts if v is not None]
    return any(known) if known else None


def import_parity(summary: pd.DataFrame, manifest: dict[str, Any]) -> ImportParity:
    """Each imported point (summary rows of mode `imported`) against our points in the same workload: its
    model, mean lengths and load beside ours; a point on another model, or with lengths off by more than
    `LENGTH_TOLERANCE`, is excluded from the ranking. Workloads with no point of ours are left alone."""
    header = ["imported point", "model", "prompt tokens (mean)", "output tokens (mean)", "load", "ranked"]
    out = ImportParity(header, [], [], [])
    if summary.empty or "mode" not in summary:
        return out
    config = manifest.get("config") or {}
    ours_model = config.get("served_model") or config.get("model")
    ours_names = [config.get(k) for k in ("model", "served_model", "tokenizer")]
    entries = {
        (e.get("backend"), e.get("variant") or "", e.get("workload") or "", e.get("load_point")): e
        for e in manifest.get("imported") or []
    }
    imported = summary[summary["mode"] == "imported"]
    ours = summary[summary["mode"] != "imported"]
    for index, row in imported.iterrows():
        mine = ours[ours["workload"] == row["workload"]]
        if mine.empty:
            continue
        entry = entries.get((row["backend"], row["variant"] or "", row["workload"], row["load_point"]), {})
        name = f"{row['backend']}{':' + row['variant'] if row['variant'] else ''} {row['load_point']}"
        reasons = []
        model = entry.get("model")
        if _names_agree([model, entry.get("tokenizer")], ours_names) is False:
            reasons.append(f"its model {model} is not this run's {ours_model}")
        lengths = []
        for column, what in (("input_tokens_mean", "prompts"), ("output_tokens_mean", "outputs")):
            theirs, ref = float(row[column]), float(mine[column].mean())
            lengths.append(f"{theirs:.0f} against {ref:.0f}")
            if theirs > 0 and ref > 0 and max(theirs / ref, ref / theirs) > LENGTH_TOLERANCE:
                reasons.append(f"its {what} average {theirs:.0f} tokens against this run's {ref:.0f}")
        loads = list(dict.fromkeys(mine["load_point"]))
        load = row["load_point"] + ("" if row["load_point"] in loads else f" (ours: {', '.join(loads)})")
        out.rows.append(
            [
                name,
                f"{model or 'unknown'} against {ours_model or 'unknown'}",
                *lengths,
                load,
                "no" if reasons else "yes",
            ]
        )
        if reasons:
            out.excluded.append(index)
            out.sentences.append(
                f"{name} (imported, workload {row['workload']}) is not ranked against this run's backends: "
                f"{'; '.join(reasons)}. It measured another workload."
            )
    return out
