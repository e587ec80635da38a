"""`--set NAME=VALUE`: same-machine A/B runs of a kernel choice, by setting a module-level knob of
reference_engine.kernels.triton_ops before the engine is built (each knob is a named constant there, with why
it is set as it is)."""

from __future__ import annotations

import argparse


def add_set_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KNOB=VALUE",
        help="set a knob of reference_engine.kernels.triton_ops first (0/1 for booleans), "
        "e.g. ATTENTION_PDL=1; repeatable; recorded in each row",
    )


def set_knobs(assignments: list[str]) -> dict:
    """Apply NAME=VALUE settings to reference_engine.kernels.triton_ops (same-machine A/B runs of a kernel
    choice)."""
    if not assignments:
        return {}
    from reference_engine.kernels import triton_ops

    knobs = {}
    for assignment in assignments:
        name, _, text = assignment.partition("=")
        if not hasattr(triton_ops, name):
            raise SystemExit(f"--set: reference_engine.kernels.triton_ops has no knob {name!r}")
        current = getattr(triton_ops, name)
        value = bool(int(text)) if isinstance(current, bool) else type(current)(text)
        setattr(triton_ops, name, value)
        knobs[name] = value
    return knobs
