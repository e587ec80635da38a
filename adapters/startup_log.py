"""Start-up phases read from a backend's own log lines: what it spent on weights, compilation or engine build,
KV-cache allocation and graph capture, in the backend's own words.

Each adapter declares `startup_patterns`: (phase name, regex). Named groups `seconds` (a duration), `gib`,
`mib` (memory) and any others (`tokens`, `sizes`, ...) land in the phase's fields. Progress bars' carriage
returns and colour codes are stripped first, so a line is matched as the terminal would finally show it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_DURATION = re.compile(r"^(?P<n>[\d.]+)(?P<unit>ns|µs|us|ms|s|m|h)?$")
_UNITS = {"ns": 1e-9, "µs": 1e-6, "us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}

StartupPattern = tuple[str, re.Pattern[str]]


@dataclass
class StartupPhase:
    name: str
    seconds: float | None = None
    gib: float | None = None
    fields: dict[str, str] = field(default_factory=dict)
    line: str = ""


def parse_duration(text: str) -> float:
    """Seconds from `12.5`, `12.5s`, `250ms` or Rust's `1.234567s` / `890.1ms` debug format."""
    match = _DURATION.match(text.strip())
    if not match:
        raise ValueError(f"not a duration: {text!r}")
    return float(match["n"]) * _UNITS[match["unit"]]


def log_lines(text: str) -> list[str]:
    """Lines as a terminal shows them: colour codes gone, each carriage-return overwrite resolved."""
    lines = []
    for raw in _ANSI.sub("", text).split("\n"):
        lines.append(raw.rsplit("\r", 1)[-1] if "\r" in raw.rstrip("\r") else raw.rstrip("\r"))
    return lines


def parse_startup_log(text: str, patterns: list[StartupPattern]) -> list[StartupPhase]:
    """Every phase line in order (a phase may repeat, e.g. one weights line per worker)."""
    phases = []
    for line in log_lines(text):
        for name, pattern in patterns:
            match = pattern.search(line)
            if not match:
                continue
            groups = {k: v for k, v in match.groupdict().items() if v is not None}
            phase = StartupPhase(name, line=line.strip())
            if "seconds" in groups:
                phase.seconds = parse_duration(groups.pop("seconds"))
            if "gib" in groups:
                phase.gib = float(groups.pop("gib"))
            elif "mib" in groups:
                phase.gib = float(groups.pop("mib")) / 1024
            phase.fields = groups
            phases.append(phase)
            break
    return phases


def patterns(*pairs: tuple[str, str]) -> list[StartupPattern]:
    return [(name, re.compile(regex)) for name, regex in pairs]
