"""The report's sections, in order. Each makes its blocks (`compare/report/blocks.py`) from the analysis
(`compare.analysis.results.Results`); report.md and report.html render the same list."""

from __future__ import annotations

from collections.abc import Callable

from compare.analysis.results import Results
from compare.report.blocks import Block
from compare.report.decision_sections import (
    break_even_section,
    decision_section,
    header_section,
    parity_section,
    setup_cost_section,
    warnings_section,
)
from compare.report.result_sections import (
    definitions_section,
    gpu_energy_section,
    intended_latency_section,
    normalised_section,
    plots_section,
    results_section,
    turns_section,
)
from compare.report.sweep_section import sweep_capacity_section

#: The report's sections, in order: each makes its blocks from the results. A new section is a function
#: (in one of the modules above, or a new one) and its place in this list.
SECTIONS: list[Callable[[Results], list[Block]]] = [
    header_section,
    decision_section,
    warnings_section,
    parity_section,
    plots_section,
    setup_cost_section,
    break_even_section,
    results_section,
    gpu_energy_section,
    intended_latency_section,
    sweep_capacity_section,
    turns_section,
    normalised_section,
    definitions_section,
]


def build_blocks(res: Results) -> list[Block]:
    return [block for section in SECTIONS for block in section(res)]
