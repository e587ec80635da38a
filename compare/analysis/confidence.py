"""The confidence words of every comparison in a report, defined once, and the qualifiers a verdict carries.

One ladder for the interactive, throughput and capacity sentences (and the set-up pay-back), from the
evidence each comparison has:

- established: the within-run 95% interval excludes 1 beyond the tie margin AND the difference held in
  each of at least two launches (or measurement blocks) run in alternating order (`--repeats`), so neither
  drift between one backend's turn and the next nor the order of the runs can have made it.
- indicated: the within-run interval excludes 1 beyond the tie margin, but each candidate was launched or
  measured once: the interval covers request-to-request variation only, and cannot separate the backends
  from whatever changed on the machine between their turns.
- not established: the interval holds 1, the launches disagree, or too few requests (counts given).
- tie: the whole interval lies within the tie margin of 1, however sure.

Qualifiers: what a reader must weigh with a verdict (repeated prompts, unequal settings, small n, late
client, one launch, points cut short, failures). Anything that finds such a thing
(compare/analysis/caveats.py, compare/analysis/parity.py) produces `Qualifier`s; `qualifiers_for` picks those
touching a pick's candidates at its compared points, so the Decision names them without knowing their kinds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np
from scipy import stats

from compare.common.text import plural

TIE_MARGIN = 0.02  # a difference whose whole 95% interval lies within 2% either way is a tie, however sure
MIN_N = 10  # fewer requests than this on either side cannot establish or indicate a difference
POWER = 0.8  # the chance that the sample size `requests_needed` names finds a real difference of that size
Z_HALF = float(stats.norm.ppf(0.975))  # two-sided 95%
Z_POWER = float(stats.norm.ppf(POWER))  # one-sided, the power asked for


class Confidence(Enum):
    """The ladder, strongest first; `.value` is the word a report prints."""

    ESTABLISHED = "established"
    INDICATED = "indicated"
    NOT_ESTABLISHED = "not established"
    TIE = "tie"

    @property
    def meaning(self) -> str:
        return LEGEND[self]

    @property
    def decisive(self) -> bool:
        """Strong enough to choose by and to weigh a set-up cost against."""
        return self is Confidence.ESTABLISHED


ONE_LAUNCH = "one launch each: cannot separate the backends from drift between their turns"

LEGEND: dict[Confidence, str] = {
    Confidence.ESTABLISHED: (
        f"the within-run 95% interval excludes 1 by more than the {TIE_MARGIN:.0%} tie margin, and the "
        "difference held in each of at least two launches or blocks run in alternating order"
    ),
    Confidence.INDICATED: (
        f"the within-run 95% interval excludes 1 by more than the {TIE_MARGIN:.0%} tie margin, but from "
        f"{ONE_LAUNCH}"
    ),
    Confidence.NOT_ESTABLISHED: (
        "the interval holds 1, the launches disagree, or there are too few requests (at least "
        f"{MIN_N} each): neither is shown to be better, so treat them as tied"
    ),
    Confidence.TIE: f"the whole 95% interval lies within {TIE_MARGIN:.0%} of 1 either way",
}


def legend() -> list[str]:
    """One line per word, for the report's Decision."""
    return [f"**{c.value}**: {c.meaning}." for c in Confidence]


def practically_equal(lo: float, hi: float) -> bool:
    """The whole interval of a ratio lies within `TIE_MARGIN` of 1: whichever is ahead, not by enough to
    choose by (nor to pay back a set-up cost)."""
    return bool(np.isfinite(lo) and np.isfinite(hi) and lo >= 1 / (1 + TIE_MARGIN) and hi <= 1 + TIE_MARGIN)


def beyond_margin(lo: float, hi: float) -> bool:
    """The interval of a (winner over other) ratio excludes 1 and is not a tie."""
    return bool(np.isfinite(lo) and lo > 1 and not practically_equal(lo, hi))


@dataclass(frozen=True)
class Verdict:
    """A comparison's confidence and the reason in words (with the real counts)."""

    level: Confidence
    reason: str = ""

    @property
    def decisive(self) -> bool:
        return self.level.decisive

    def words(self) -> str:
        return f"{self.level.value} ({self.reason})" if self.reason else self.level.value


def verdict(
    lo: float,
    hi: float,
    n: tuple[int, int],
    launches: list[float] | None = None,
    test_p: float = math.nan,
    shown: str = "",
) -> Verdict:
    """The one rule: `lo`-`hi` is the within-run 95% interval of (first / other) where > 1 favours the
    first; `n` the requests each side; `launches` the same ratio per launch or block (alternating order);
    `test_p` an optional rank test's p-value that must also be below 0.05 when given; `shown` how the
    interval is described."""
    counts = f"{n[0]} and {plural(n[1], 'request')}"
    bits = [b for b in (shown,) if b]
    if min(n) < MIN_N:
        return Verdict(
            Confidence.NOT_ESTABLISHED, "; ".join([f"{counts}: at least {MIN_N} each are needed", *bits])
        )
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return Verdict(Confidence.NOT_ESTABLISHED, "; ".join(["no interval available", *bits]))
    if practically_equal(lo, hi):
        return Verdict(Confidence.TIE, "; ".join(bits))
    significant = beyond_margin(lo, hi) and (not np.isfinite(test_p) or test_p < 0.05)
    values = [v for v in (launches or []) if np.isfinite(v)]
    per = ", ".join(f"{v:.2f}x" for v in values)
    if not significant:
        each = [f"per launch {per}"] if len(values) >= 2 else []
        return Verdict(Confidence.NOT_ESTABLISHED, "; ".join([*bits, *each, "the interval holds 1"]))
    if len(values) < 2:
        return Verdict(Confidence.INDICATED, "; ".join([ONE_LAUNCH, *bits]))
    if all(v > 1 for v in values):
        return Verdict(
            Confidence.ESTABLISHED,
            "; ".join([f"ahead in each of {plural(len(values), 'launch', 'launches')}: {per}", *bits]),
        )
    return Verdict(
        Confidence.NOT_ESTABLISHED,
        "; ".join(
            [f"not ahead in every launch ({per}): the launches differ as much as the candidates do", *bits]
        ),
    )


def requests_needed(ratio: float, lo: float, n: int) -> int | None:
    """Requests each that would make a 95% interval exclude 1 beyond the tie margin with `POWER` chance, if
    the ratio holds and the interval's half-width shrinks as 1/sqrt(n); None when no run length would."""
    target = ratio - (1 + TIE_MARGIN)
    if not (np.isfinite(ratio) and np.isfinite(lo)) or target <= 0 or ratio - lo <= 0:
        return None
    sigma = (ratio - lo) / Z_HALF * math.sqrt(n)  # the spread of one request's worth
    return max(MIN_N, math.ceil((sigma * (Z_HALF + Z_POWER) / target) ** 2))


def bracket_verdict(apart: list[bool]) -> Verdict:
    """The capacity ranking's word: `apart` holds, per search (one per launch), whether the winner's bracket
    lies wholly above the runner-up's (its lower end at or above the other's upper end). One search each is
    indicated at most, as any comparison from one launch each."""
    if not apart or not all(apart):
        return Verdict(Confidence.NOT_ESTABLISHED, "the brackets overlap")
    if len(apart) < 2:
        return Verdict(Confidence.INDICATED, f"the brackets do not overlap; {ONE_LAUNCH}")
    return Verdict(Confidence.ESTABLISHED, f"the brackets do not overlap in any of {len(apart)} launches")


# -- qualifiers -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Qualifier:
    """Something that qualifies a verdict. `kind` groups them (a short noun: "repeated prompts", "unequal
    settings", "points cut short", "late client", "failed requests", ...); `text` is the clause the Decision
    prints; `detail` the full warning line (defaults to `text`). Scope: `keys` the backend keys it is about
    (empty: every backend), `workload` and `load_point` ("" for all). `between`: a difference among `keys`
    (a parity finding), which touches a comparison only when two of its keys are the compared candidates.
    `verdict` False for a note that cannot change a verdict (listed with the warnings only)."""

    kind: str
    text: str
    keys: tuple[str, ...] = ()
    workload: str = ""
    load_point: str = ""
    between: bool = False
    verdict: bool = True
    detail: str = ""

    def __post_init__(self) -> None:
        if not self.detail:
            object.__setattr__(self, "detail", self.text)

    def touches(self, workload: str, points: dict[str, str | None]) -> bool:
        """Does it concern the candidates `points` (key -> the load point compared, None: any) in
        `workload`?"""
        if self.workload and workload and self.workload != workload:
            return False
        hit = [
            k
            for k, p in points.items()
            if (not self.keys or k in self.keys)
            and (not self.load_point or p is None or p == self.load_point)
        ]
        return len(hit) >= 2 if self.between else bool(hit)


def qualifiers_for(found: list[Qualifier], workload: str, points: dict[str, str | None]) -> list[Qualifier]:
    """The qualifiers touching the compared candidates `points` (key -> the load point it was compared at,
    None for all its points) in `workload`, one per (kind, text), in the order found."""
    out: dict[tuple[str, str], Qualifier] = {}
    for q in found:
        if q.verdict and q.touches(workload, points):
            out.setdefault((q.kind, q.text), q)
    return list(out.values())


def qualifier_sentence(found: list[Qualifier]) -> str:
    """ "Qualified by: kind (text; text); kind (text)." for the Decision."""
    if not found:
        return ""
    kinds: dict[str, list[str]] = {}
    for q in found:
        kinds.setdefault(q.kind, []).append(q.text)
    parts = [f"{kind} ({'; '.join(texts)})" for kind, texts in kinds.items()]
    return "Qualified by " + "; ".join(parts) + "."
