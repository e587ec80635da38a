"""The report's opening sections: what ran (header), what to deploy and why (Decision), what to know before
trusting the numbers (Warnings), the backends' settings side by side (parity), and what each costs to set
up."""

from __future__ import annotations

import math

from adapters import ADAPTERS
from compare.analysis.confidence import legend
from compare.analysis.parity import parity_table
from compare.analysis.results import Results
from compare.analysis.selection import break_even_rows
from compare.analysis.warning_groups import warning_groups
from compare.common.datatypes import describe_phases
from compare.launch.serving_match import serving_match_lines
from compare.report.blocks import Block, number


def header_section(res: Results) -> list[Block]:
    """Title, status, model, machine, command and the SLOs in force."""
    m = res.run.manifest
    config = m.get("config") or {}
    status = m.get("status", "unknown")
    partial = " — a partial report of what was measured before the run stopped."
    head = [
        f"Status: **{status}**" + (partial if status == "interrupted" else "."),
        f"Model: `{config.get('model', '?')}`; created {m.get('created', '?')}.",
    ]
    mach = m.get("machine") or {}
    if mach:
        gpus = mach.get("gpus") or "none"
        head.append(
            f"Machine: {mach.get('cpus', '?')} CPUs ({mach.get('processor', '?')}), "
            f"{mach.get('memory_gib', '?')} GiB, "
            f"GPUs: {gpus if isinstance(gpus, str) else ', '.join(gpus) or 'none'}."
            + (f" CPU pinning: {m['pinning']}." if m.get("pinning") else "")
        )
    if m.get("command"):
        head.append("Command: `" + " ".join(m["command"]) + "`")
    blocks: list[Block] = [("h1", f"llm-compare report: {m.get('run_id', res.run.path.name)}")]
    blocks.append(("p", " ".join(head[:2])))
    blocks += [("p", h) for h in head[2:]]
    slo = config.get("slo_s") or {}
    if slo:
        limits = ", ".join(f"{k} ≤ {v * 1e3:g} ms" for k, v in slo.items())
        blocks.append(("p", f"SLOs: {limits}; goodput counts the requests within all of them."))
    else:
        blocks.append(
            (
                "p",
                "No SLO given (`--slo ttft=200ms,tpot=50ms`): goodput is not computed; the interactive "
                "class ranks by median end-to-end latency, the batch class by output tokens/s.",
            )
        )
    return blocks


def decision_section(res: Results) -> list[Block]:
    """The picks' sentences, memory trade notes and the CPU note."""
    config = res.run.manifest.get("config") or {}
    blocks: list[Block] = [("h2", "Decision")]
    if config.get("candidates_reason"):
        blocks.append(("p", config["candidates_reason"]))
    if res.summary.empty:
        blocks.append(("p", "No request was measured: there is nothing to decide."))
    blocks += [("p", " ".join(pick.sentences)) for pick in res.picks if pick.sentences]
    if any(pick.confidence for pick in res.picks):
        blocks += [("p", "Confidence, one ladder for every comparison above:"), ("ul", legend())]
    blocks += [("p", note) for note in res.memory_notes]
    blocks += [("p", sentence) for sentence in res.imports.sentences]
    cpu_note = _cpu_note(res)
    if cpu_note:
        blocks.append(("p", cpu_note))
    return blocks


def warnings_section(res: Results) -> list[Block]:
    """The run's notes, then the caveats grouped by kind with counts per backend and point: first the kinds
    that touch a verdict in the Decision, then the rest; a kind that can change no number (re-tokenisation
    notes) is one line of counts."""
    notes = list(res.run.manifest.get("notes") or [])
    if not notes and not res.qualifiers:
        none = "None: no failed or cancelled requests, no token-count mismatch, no client lag."
        return [("h2", "Warnings"), ("p", none)]
    blocks: list[Block] = [("h2", "Warnings")]
    if notes:
        blocks.append(("ul", notes))
    for kind, head, lines in warning_groups(res.qualifiers, res.picks):
        blocks.append(("p", f"**{kind}**{head.removeprefix(kind)}"))  # each heading starts with its kind
        if lines:
            blocks.append(("ul", lines))
    return blocks


def parity_section(res: Results) -> list[Block]:
    """What each backend declares of itself, side by side, with the settings they differ on flagged, and
    what the launch could not give every backend alike (`compare.launch.serving_match`)."""
    if not res.declared and not res.imports.rows:
        return []
    header, rows = parity_table(res.declared)
    explained = (
        "What each backend declares of itself, and where it said so (models route: its `GET /v1/models` "
        "answer; log: its start-up log; metrics: its `/metrics` info gauges; command: the flags it was "
        "launched with; default: its documented default; launch: its tokenizer files' hash, or its name "
        "where the files are not on this machine; records: whether every forced output came back at the "
        "length asked for). Unknown is never counted as a difference (why, where known, in brackets); ⚠ "
        "marks a setting two backends declare differently."
    )
    verdict: Block = (
        ("ul", [f.sentence() for f in res.parity])
        if res.parity
        else ("p", "No difference among the settings the backends declare.")
    )
    matching = serving_match_lines(res.run.manifest, res.declared)
    blocks: list[Block] = [("h2", "Parity of the backends")]
    if res.declared:
        blocks += [("p", explained), ("table", (header, rows)), verdict]
    blocks += [("p", "Serving settings matched at launch:"), ("ul", matching)] if matching else []
    if res.imports.rows:
        blocks += [
            (
                "p",
                "Imported points against this run's (mean lengths: theirs against ours); one that measured "
                "another model or other lengths is never ranked against ours:",
            ),
            ("table", (res.imports.header, res.imports.rows)),
        ]
    return blocks


SETUP_COLUMNS = [
    "backend",
    "launcher",
    "ready (s, measured)",
    "ready (s, logged)",
    "phases (s)",
    "weights GiB",
    "KV GiB",
    "graph pool GiB",
    "peak RSS GiB",
    "GPU memory GiB",
    "device",
    "cold first token (ms)",
]


def setup_cost_section(res: Results) -> list[Block]:
    """One row per launched backend: time to ready, its phases, memory, and the cold first token."""
    explained = (
        "Ready: spawn (process or container) to the first healthy answer, as measured here, and as the "
        "server logs it about itself. Phases: from the server's own start-up lines, in its words. Cold "
        "first token: for a launched server, from ready to the first token of the first request sent "
        "right after it; for a running endpoint, the first measured request's TTFT. Peak RSS: the "
        "server's processes' peak resident memory summed (a container: its highest memory reading). GPU "
        "memory: what the launch added on the visible GPUs by ready (nvidia-smi, before and after)."
    )
    rows = []
    for key, st in res.setups.items():
        mem = st.memory
        rows.append(
            [
                key,
                st.launcher,
                number(st.ready_s, 2),
                number(st.server_ready_s, 2),
                describe_phases([p for p in st.phases if p.name != "server_ready"], 2, "") or "–",
                *(
                    number(mem.get(k, math.nan) / 2**30, 3)
                    for k in ("weights", "kv_cache", "graph_pool", "peak_rss", "device_used")
                ),
                st.device or "–",
                number(res.cold_first_token.get(key, math.nan) * 1e3, 1),
            ]
        )
    return [("h2", "Set-up cost"), ("p", explained), ("table", (SETUP_COLUMNS, rows))]


def break_even_section(res: Results) -> list[Block]:
    """Every pair of launched candidates: when the faster one's longer start pays back."""
    s = res.summary
    pairs = break_even_rows(res.picks, s, res.setups, res.requests, res.seed) if not s.empty else []
    if not pairs:
        return []
    explained = (
        "For each pair of launched candidates: the one faster per request, how long each took to be "
        "ready, and after how many requests the faster one's longer start pays back (set-up + N x "
        "time per request equal, N rounded up), with how long serving those takes at its measured rate. A "
        "difference not established (as in the decision) pays nothing back; one only indicated, or a "
        "start-up gap from one launch each, gives a pay-back that is indicated, never established."
    )
    header = [
        "workload",
        "class (time per request)",
        "faster",
        "other",
        "ready s",
        "per request",
        "pays back",
    ]
    return [("h2", "Set-up cost against latency"), ("p", explained), ("table", (header, pairs))]


def _cpu_note(res: Results) -> str:
    """Which candidates ran on the CPU where their engine runs eager whatever the variant (`eager_on_cpu`)."""
    cpu = [
        k
        for k, st in res.setups.items()
        if st.device and st.device.startswith("cpu") and _eager_on_cpu(st.backend)
    ]
    if not cpu:
        return ""
    graphs = [k for k in cpu if k.endswith(":graphs")]
    note = (
        f"{', '.join(cpu)} ran on the CPU, where the reference engine never uses CUDA graphs: every "
        "variant runs eager"
    )
    if graphs:
        note += f" ({', '.join(graphs)} included), so a difference between its variants is noise, not graphs"
    return note + "."


def _eager_on_cpu(backend: str) -> bool:
    cls = ADAPTERS.get(backend)
    return cls is not None and cls.eager_on_cpu
