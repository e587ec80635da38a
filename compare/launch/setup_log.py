"""How a backend's own start-up log becomes part of its `SetupReport` (`compare/common/datatypes.py`).

The log knowledge lives in the adapters (`startup_patterns`, `log_clock`: see `adapters/startup_log.py`);
this module turns any adapter's matches into a `ParsedLog` the same way, and lays its phases on the launch's
time line (`apply_log`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from adapters.startup_log import StartupPattern, log_lines, parse_startup_log, read_config
from compare.common.datatypes import GIB, Phase, SetupReport


@dataclass
class ParsedLog:
    phases: list[Phase] = field(default_factory=list)  # end_s holds an absolute epoch time here, if logged
    memory: dict[str, float] = field(default_factory=dict)
    device: str | None = None
    dtype: str | None = None
    server_ready_s: float | None = None  # the server's own spawn-to-ready figure, if it logs one
    first_line_epoch: float | None = (
        None  # when the process logged its first stamped line (after its imports)
    )
    settings: dict[str, str] = field(default_factory=dict)  # its configuration line's values, as written


def parse_log(backend: str, text: str, near: float | None = None) -> ParsedLog:
    """The start-up facts in `text`, read with the patterns and clock of the adapter named `backend`
    (`near`: an epoch time close to the log's, for clocks without a year)."""
    from adapters import ADAPTERS

    cls = ADAPTERS.get(backend)
    if cls is None or not cls.startup_patterns:
        return ParsedLog()
    log_clock = getattr(cls, "log_clock", None)
    out = ParsedLog(settings=read_config(text, cls.config_lines))
    if log_clock is not None:
        for line in log_lines(text):
            out.first_line_epoch = log_clock.epoch(line, near)
            if out.first_line_epoch is not None:
                break
    raw: list[tuple[Phase, str]] = []
    opened: dict[str, tuple[float | None, StartupPattern, str]] = {}
    weak: set[str] = set()
    for match in parse_startup_log(text, cls.startup_patterns, log_clock, near):
        pattern, fields, when = match.pattern, dict(match.fields), match.epoch
        assert pattern is not None
        if pattern.ready:
            if out.server_ready_s is None and match.seconds is not None:
                out.server_ready_s = match.seconds
            if not any(p.name == "server_ready" for p, _ in raw):
                raw.append((Phase("server_ready", 0.0, when, "HTTP server listening"), "max"))
            continue
        detail = _detail(pattern.detail, match.gib, fields)
        if pattern.phase and match.seconds is not None:
            raw.append((Phase(pattern.phase, match.seconds, when, detail), pattern.repeat))
        if pattern.begins:
            opened[pattern.begins] = (when, pattern, detail)
        if pattern.ends and pattern.ends in opened:
            began, opener, opened_detail = opened.pop(pattern.ends)
            if began is not None and when is not None:
                raw.append((Phase(pattern.ends, round(when - began, 6), when, opened_detail), opener.repeat))
        _memory(out, pattern, match.gib, fields, weak)
        if fields.get("device"):
            out.device = fields["device"]
        if fields.get("dtype"):
            out.dtype = fields["dtype"].removeprefix("torch.")
    out.phases = _merge(raw)
    return out


def _detail(text: str, gib: float | None, fields: dict[str, str]) -> str:
    facts = [f"{gib:g} GiB"] if gib is not None else []
    facts += [f"{k} {v}" for k, v in fields.items() if k not in ("url",)]
    return ", ".join(filter(None, [text, *facts]))


def _memory(
    out: ParsedLog, pattern: StartupPattern, gib: float | None, fields: dict[str, str], weak: set[str]
) -> None:
    found: dict[str, float] = {}
    if gib is not None and pattern.memory and pattern.memory != "kv_tokens":
        found[pattern.memory] = gib * GIB
    if "tokens" in fields:
        found["kv_tokens"] = float(fields["tokens"].replace(",", ""))
    elif "blocks" in fields and "block_size" in fields:
        found["kv_tokens"] = float(int(fields["blocks"]) * int(fields["block_size"]))
    for key, value in found.items():
        if pattern.weak and key in out.memory and key not in weak:
            continue  # a weak figure never replaces one read elsewhere
        if pattern.repeat == "sum" and key in out.memory and key not in weak:
            value += out.memory[key]  # rounds one after another hold their memory side by side
        out.memory[key] = value
        (weak.add if pattern.weak else weak.discard)(key)


def _merge(raw: list[tuple[Phase, str]]) -> list[Phase]:
    """One phase per name, in order of first appearance: repeated lines (workers, shards, rounds) are
    combined by their pattern's rule, `max` or `sum`, ending at the last one."""
    merged: dict[str, Phase] = {}
    for phase, rule in raw:
        seen = merged.get(phase.name)
        if seen is None:
            merged[phase.name] = Phase(phase.name, phase.seconds, phase.end_s, phase.detail)
            continue
        seen.seconds = seen.seconds + phase.seconds if rule == "sum" else max(seen.seconds, phase.seconds)
        if phase.end_s is not None:
            seen.end_s = max(seen.end_s or phase.end_s, phase.end_s)
    return list(merged.values())


def apply_log(report: SetupReport, parsed: ParsedLog) -> None:
    """Fill `report` from a parsed log: phases as offsets from the spawn, laid end to end where the log gives
    no clock, with the interpreter start-up (spawn to the first log line) as a phase of its own."""
    spawned = report.spawned_at
    phases: list[Phase] = []
    if spawned is not None and parsed.first_line_epoch is not None:
        start = max(0.0, parsed.first_line_epoch - spawned)
        phases.append(Phase("process_start", start, start, "interpreter and imports, to the first log line"))
    cursor = phases[-1].end_s if phases else 0.0
    for p in parsed.phases:
        end = p.end_s - spawned if (p.end_s is not None and spawned is not None) else None
        if end is None or end < (cursor or 0.0) - 1.0:  # no clock, or a clock that disagrees: lay end to end
            end = (cursor or 0.0) + p.seconds
        phases.append(Phase(p.name, p.seconds, round(end, 3), p.detail))
        cursor = end
    report.phases = phases
    report.memory.update(parsed.memory)
    report.device, report.dtype = parsed.device or report.device, parsed.dtype or report.dtype
    report.server_ready_s = parsed.server_ready_s
    report.log_settings = dict(parsed.settings)
