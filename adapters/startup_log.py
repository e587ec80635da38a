"""Start-up phases read from a backend's own log lines: what it spent on weights, compilation or engine build,
KV-cache allocation and graph capture, in the backend's own words.

Each adapter declares `startup_patterns` (a list of `StartupPattern`) and `log_clock` (how its lines carry the
time). A pattern says what its line yields:

- `phase`: the common phase name its duration counts towards (`weights`, `compile`, `engine_build`,
  `kv_cache`, `cuda_graphs`, `warmup`, ...); the duration is the named group `seconds` (`12.5`, `250ms`,
  Rust's `1.234567s`, or `hh:mm:ss`), or, for a pattern that only marks where a phase `begins` or `ends`, the
  time between two such lines by the log's clock;
- `memory`: the key (`weights`, `kv_cache`, `graph_pool`) its `gib` / `mib` group fills, and `kv_tokens`
  from a `tokens` group, or from `blocks` x `block_size`; `weak` values never replace a value read elsewhere;
- `device` / `dtype`: from groups of those names;
- `ready`: the line says the server is listening (its `seconds`, if any, is the server's own spawn-to-ready).

A server that prints its configuration as `key=value` pairs on one line (vLLM's engine config) declares a
`ConfigLine`: which line, and a regex for each setting's value in it, or a function that reads the line's
settings itself (vLLM's `non-default args: {...}`, a Python dict); `read_config` returns those values as
the log wrote them, for the comparator's parity audit of the backends.

Repeated lines of one phase (one per worker or shard, or one per capture round) are combined by `repeat`:
`max` (parallel workers) or `sum` (rounds one after another; their memory figures add up too). Progress
bars' carriage returns and colour codes are stripped first, so a line is matched as the terminal would
finally show it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TypedDict, Unpack

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DURATION = re.compile(r"^(?P<n>[\d.]+)(?P<unit>ns|µs|us|ms|s|m|h)?$")
_CLOCK_DURATION = re.compile(r"^(?P<h>\d+):(?P<m>\d\d):(?P<s>\d\d(?:\.\d+)?)$")
_UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


@dataclass(frozen=True)
class StartupPattern:
    """One kind of start-up line and what it yields (see the module docstring)."""

    name: str
    regex: re.Pattern[str]
    phase: str | None = None
    memory: str | None = None
    weak: bool = False
    begins: str | None = None
    ends: str | None = None
    ready: bool = False
    repeat: str = "max"
    detail: str = ""


@dataclass(frozen=True)
class LogClock:
    """Where a line's time stamp is and how to read it. `year`: False when the stamp has none (vLLM's
    `05-12 10:00:01`), so the year is taken from the launch; `utc`: the stamp is UTC (TGI's `...Z`)."""

    regex: re.Pattern[str]
    fmt: str
    year: bool = True
    utc: bool = False

    def epoch(self, line: str, near: float | None = None) -> float | None:
        match = self.regex.search(line)
        if not match:
            return None
        stamp = match.group(1)
        fmt = self.fmt
        if not self.year:
            ref = datetime.fromtimestamp(near) if near is not None else datetime.now()
            stamp, fmt = f"{ref.year} {stamp}", f"%Y {fmt}"
        try:
            when = datetime.strptime(stamp, fmt)
        except ValueError:
            return None
        if self.utc:
            when = when.replace(tzinfo=UTC)
        value = when.timestamp()
        if not self.year and near is not None and value > near + 86400:  # a log from last December
            value = when.replace(year=when.year - 1).timestamp()
        return value


def clock(regex: str, fmt: str, *, year: bool = True, utc: bool = False) -> LogClock:
    return LogClock(re.compile(regex), fmt, year, utc)


@dataclass
class StartupPhase:
    """One matched start-up line."""

    name: str
    seconds: float | None = None
    gib: float | None = None
    fields: dict[str, str] = field(default_factory=dict)
    line: str = ""
    epoch: float | None = None  # the line's time stamp, when the log has a clock
    pattern: StartupPattern | None = None


def parse_duration(text: str) -> float:
    """Seconds from `12.5`, `12.5s`, `250ms`, Rust's `1.234567s` / `890.1ms` debug format, or `hh:mm:ss`."""
    text = text.strip()
    match = _CLOCK_DURATION.match(text)
    if match:
        return int(match["h"]) * 3600 + int(match["m"]) * 60 + float(match["s"])
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"not a duration: {text!r}")
    return float(match["n"]) * _UNITS[match["unit"]]


def log_lines(text: str) -> list[str]:
    """Lines as a terminal shows them: colour codes gone, each carriage-return overwrite resolved."""
    lines = []
    for raw in _ANSI.sub("", text).split("\n"):
        lines.append(raw.rsplit("\r", 1)[-1] if "\r" in raw.rstrip("\r") else raw.rstrip("\r"))
    return lines


def parse_startup_log(
    text: str, patterns: list[StartupPattern], log_clock: LogClock | None = None, near: float | None = None
) -> list[StartupPhase]:
    """Every start-up line in order (a phase may repeat, e.g. one weights line per worker); `near` is an epoch
    time close to the log's (the launch), for clocks without a year."""
    phases = []
    for line in log_lines(text):
        for pattern in patterns:
            match = pattern.regex.search(line)
            if not match:
                continue
            groups = {k: v for k, v in match.groupdict().items() if v is not None}
            phase = StartupPhase(pattern.name, line=line.strip(), pattern=pattern)
            if "seconds" in groups:
                phase.seconds = parse_duration(groups.pop("seconds"))
            if "gib" in groups:
                phase.gib = float(groups.pop("gib"))
            elif "mib" in groups:
                phase.gib = float(groups.pop("mib")) / 1024
            phase.fields = groups
            phase.epoch = log_clock.epoch(line, near) if log_clock is not None else None
            phases.append(phase)
            break
    return phases


class PatternYields(TypedDict, total=False):
    """What a `StartupPattern` yields besides its name and regex (its fields of the same names)."""

    phase: str | None
    memory: str | None
    weak: bool
    begins: str | None
    ends: str | None
    ready: bool
    repeat: str
    detail: str


def pattern(name: str, regex: str, **yields: Unpack[PatternYields]) -> StartupPattern:
    """A `StartupPattern` from a regex string; `yields` as the dataclass fields."""
    return StartupPattern(name, re.compile(regex), **yields)


def patterns(*pairs: tuple[str, str]) -> list[StartupPattern]:
    """Patterns that only name their lines (no yields)."""
    return [pattern(name, regex) for name, regex in pairs]


@dataclass(frozen=True)
class ConfigLine:
    """A start-up line where the server prints its configuration: `line` finds it, and each of `settings`
    (a common setting name -> regex whose group 1 is the value) reads one value from it."""

    line: re.Pattern[str]
    settings: dict[str, re.Pattern[str]]
    read: Callable[[str], dict[str, str]] | None = None  # all of the line's settings at once


def config_line(
    line: str, read: Callable[[str], dict[str, str]] | None = None, **settings: str
) -> ConfigLine:
    return ConfigLine(re.compile(line), {k: re.compile(v) for k, v in settings.items()}, read)


def read_config(text: str, lines: list[ConfigLine]) -> dict[str, str]:
    """Each setting's value as the log's last matching config line wrote it (a server restarted by its own
    supervisor prints the line again: the last one is the configuration it serves with)."""
    found: dict[str, str] = {}
    for line in log_lines(text):
        for config in lines:
            if not config.line.search(line):
                continue
            if config.read is not None:
                found.update(config.read(line))
            for name, regex in config.settings.items():
                match = regex.search(line)
                if match:
                    found[name] = match.group(1)
    return found
