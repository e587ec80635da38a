"""What the recipes of docs/design.md rely on: each registry they add an entry to is read everywhere it should
be, so a new dataset, latency metric or report section is checked here with the others, before any run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from checkpoints import make_tokenizer
from test_compare_report import make_run

from compare.analysis.metrics import LATENCY
from compare.analysis.results import Results, analyze
from compare.measure.load_points import FixedPoints
from compare.measure.prompts import Prompts
from compare.plan.build import DATASET_NAMES, FILE_DATASETS, build_plan
from compare.report import sections
from compare.report.blocks import Block
from compare.report.render import to_html, to_markdown
from compare.report.write import write_reports
from workloads.datasets import PromptStream

DATA = Path(__file__).parent / "data"
FILES = {"sharegpt": DATA / "sharegpt_small.json", "jsonl": DATA / "prompts.jsonl"}
BLOCK_KINDS = {"h1", "h2", "p", "ul", "table", "svg"}  # what report/render.py renders


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    make_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    """The file of each file dataset: the test data's, and a conversation of two answered turns."""
    turns = tmp_path_factory.mktemp("turns") / "conversations.json"
    said = [("human", "First question?"), ("gpt", "An answer."), ("human", "Second?"), ("gpt", "Two.")]
    turns.write_text(json.dumps([{"id": "c", "conversations": [{"from": f, "value": v} for f, v in said]}]))
    return {**FILES, "sharegpt-turns": turns}


@pytest.mark.parametrize("dataset", DATASET_NAMES)
def test_every_dataset_is_planned_and_gives_a_point_its_prompts(
    tok_dir: Path, files: dict[str, Path], dataset: str
) -> None:
    """Recipe "Adding a dataset": a name the plan accepts makes prompts (or sessions) for a load point."""
    from transformers import AutoTokenizer

    path = {"dataset_path": str(files[dataset])} if dataset in FILE_DATASETS else {}
    plan = build_plan({"backends": "vllm", "endpoints": ["vllm=http://127.0.0.1:9"], "model": "m",
                       "tokenizer": str(tok_dir), "dataset": dataset, **path, "num_requests": 3})
    prompts = Prompts(plan, AutoTokenizer.from_pretrained(str(tok_dir)), FixedPoints.most_points(plan))
    [(workload, per_point)] = prompts.workloads
    first = per_point[0]
    made = first.first(3) if isinstance(first, PromptStream) else first
    assert workload.dataset == dataset and len(made) >= 1


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Results:
    run = make_run(tmp_path_factory.mktemp("run") / "run", {"a": 0.010, "b": 0.012}, noise_seed=1)
    return analyze(run, n_boot=50)


def test_every_latency_metric_reaches_the_tables_and_the_report(results: Results) -> None:
    """Recipe "Adding a metric": one `LATENCY` entry gives the per-request column, summary.csv's columns,
    the results table's and the definition."""
    write_reports(results)
    report = (results.run.path / "report.md").read_text()
    for m in LATENCY:
        if m.per_request is not None:
            assert f"{m.name}_s" in results.requests, m.name
        columns = {f"{m.name}_n", f"{m.name}_mean_ms", f"{m.name}_p50_ms", f"{m.name}_p99_ms",
                   f"{m.name}_p50_ms_lo", f"{m.name}_p50_ms_hi"}
        assert columns <= set(results.summary.columns), m.name
        assert f"{m.label}: {m.definition}" in report, m.name
        if m.results:
            assert f"{m.label} p50" in report, m.name


def test_every_report_section_renders_and_a_new_one_is_a_function_in_the_list(
    results: Results, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recipe "Adding a report section": each section's blocks render in both reports; a new one is a
    function of the results placed in `SECTIONS`."""
    for section in sections.SECTIONS:
        blocks = section(results)
        assert {kind for kind, _ in blocks} <= BLOCK_KINDS, section.__name__
        to_markdown(blocks), to_html(blocks, "run")

    def backends_section(res: Results) -> list[Block]:
        return [("h2", "Backends measured"), ("ul", sorted(set(res.summary["backend"])))]

    placed = [*sections.SECTIONS[:2], backends_section, *sections.SECTIONS[2:]]  # after the Decision
    monkeypatch.setattr(sections, "SECTIONS", placed)
    write_reports(results)
    report = (results.run.path / "report.md").read_text()
    assert report.index("## Decision") < report.index("## Backends measured\n\n- a\n- b") < report.index(
        "## Warnings"
    )
    assert "<h2>Backends measured</h2>" in (results.run.path / "report.html").read_text()
