"""The caveats grouped as the report's Warnings and the terminal show them: per kind, the kinds that touch a
verdict in the Decision first, with counts per backend and point; a kind that can change no number
(re-tokenisation notes) is one line of counts."""

from __future__ import annotations

from compare.analysis.confidence import Qualifier
from compare.analysis.selection import touches_a_verdict
from compare.common.datatypes import Pick


def warning_groups(qualifiers: list[Qualifier], picks: list[Pick]) -> list[tuple[str, str, list[str]]]:
    """Per kind of caveat, the verdict-touching kinds first: (kind, its heading with its counts per backend
    and point, whether it touches a verdict and the advice its lines share, its lines). A kind that can
    change no number is its heading alone. The report's Warnings and the terminal's both read this."""
    out: list[tuple[str, str, list[str]]] = []
    for kind, found in _grouped(qualifiers, picks):
        touching = any(touches_a_verdict(q, picks) for q in found)
        head = f"{kind} ({_counts(found)})" + (": touches a verdict in the Decision." if touching else ".")
        if _collapsed(kind, found):
            out.append((kind, f"{head} {COLLAPSED[kind]}", []))
            continue
        lines, advice = _common_tail([q.detail for q in found])
        out.append((kind, f"{head} {advice}" if advice else head, lines))
    return out


def _grouped(qualifiers: list[Qualifier], picks: list[Pick]) -> list[tuple[str, list[Qualifier]]]:
    """The qualifiers by kind, the kinds that touch a verdict first (in the order found otherwise)."""
    groups: dict[str, list[Qualifier]] = {}
    for q in qualifiers:
        groups.setdefault(q.kind, []).append(q)
    return sorted(groups.items(), key=lambda kv: not any(touches_a_verdict(q, picks) for q in kv[1]))


def _collapsed(kind: str, found: list[Qualifier]) -> bool:
    """A kind of note that changes no number is one line of counts."""
    return kind in COLLAPSED and not any(q.verdict for q in found)


WARNING_ITEM = "  - "  # a line of `grouped_warning_lines` that belongs to the heading above it


def grouped_warning_lines(qualifiers: list[Qualifier], picks: list[Pick]) -> list[str]:
    """The caveats as the terminal shows them, grouped as the report's Warnings (`warning_groups`): each
    kind's heading, then its lines, each starting with `WARNING_ITEM`."""
    groups = warning_groups(qualifiers, picks)
    return [line for _, head, lines in groups for line in (head, *(WARNING_ITEM + x for x in lines))]


def _common_tail(lines: list[str]) -> tuple[list[str], str]:
    """Lines of one kind end in the same explanation: say it once, after the kind's heading."""
    if len(lines) < 2:
        return lines, ""
    tail = lines[0]
    for line in lines[1:]:
        while not line.endswith(tail):
            tail = tail[1:]
    cut = tail.find("; ")
    if cut < 0 or len(tail) - cut < 20:
        return lines, ""
    advice = tail[cut + 2 :]
    return [line[: len(line) - len(advice) - 2] + "." for line in lines], advice[:1].upper() + advice[1:]


COLLAPSED = {  # what a kind of note that changes no number says, once for all its points
    "token counts": "The client's re-tokenisation of the text does not always give back the generated "
    "tokens; the metrics use the server's usage, else the stream's count, so no number changes.",
}


def _counts(found: list[Qualifier]) -> str:
    """ "3 on vllm (c=1, c=16, r=85), 1 on reference:graphs (c=1)"."""
    per: dict[str, list[str]] = {}
    for q in found:
        for key in q.keys or ("all backends",):
            per.setdefault(key, []).append(q.load_point)
    return ", ".join(
        f"{len(points)} on {key}"
        + (f" ({', '.join(dict.fromkeys(p for p in points if p))})" if any(points) else "")
        for key, points in per.items()
    )
