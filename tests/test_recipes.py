"""What the recipes of docs/design.md rely on: each registry they add an entry to is read everywhere it should
be, so a new dataset, latency metric or report section is checked here with the others, before any run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from checkpoints import make_tokenizer
from test_compare_report import make_run
from test_workloads_datasets import dataset_options, example_files

from compare.analysis.metrics import LATENCY
from compare.analysis.results import Results, analyze
from compare.measure.load_points import FixedPoints
from compare.measure.prompts import Prompts
from compare.plan.build import build_plan
from compare.plan.run_options import PlanError
from compare.report import sections
from compare.report.blocks import Block
from compare.report.render import to_html, to_markdown
from compare.report.write import write_reports
from workloads.catalog import DATASETS, Generated, Workload, length, reads
from workloads.datasets import PromptStream, random_dataset

BLOCK_KINDS = {"h1", "h2", "p", "ul", "table", "svg"}  # what report/render.py renders


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tok")
    make_tokenizer(out)
    return out


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> Path:
    """The files of the file datasets' options in tests/test_workloads_datasets.py (`PINNED_OPTIONS`)."""
    return example_files(tmp_path_factory.mktemp("files"))


@pytest.mark.parametrize("dataset", list(DATASETS))
def test_every_dataset_is_planned_and_gives_a_point_its_prompts(
    tok_dir: Path, files: Path, dataset: str
) -> None:
    """Recipe "Adding a dataset": every declared dataset (workloads/catalog.py), with the options its test
    gives it (`PINNED_OPTIONS`), is planned and makes prompts (or sessions) for a load point."""
    from transformers import AutoTokenizer

    plan = build_plan(
        {
            "backends": "vllm",
            "endpoints": ["vllm=http://127.0.0.1:9"],
            "model": "m",
            "tokenizer": str(tok_dir),
            "dataset": dataset,
            **dataset_options(dataset, files),
            "num_requests": 3,
        }
    )
    prompts = Prompts(plan, AutoTokenizer.from_pretrained(str(tok_dir)), FixedPoints.most_points(plan))
    [(workload, per_point)] = prompts.workloads
    first = per_point[0]
    made = first.first(3) if isinstance(first, PromptStream) else first
    assert workload.dataset == dataset and len(made) >= 1


def test_a_dataset_declared_in_the_catalog_alone_is_planned_checked_labelled_and_made(
    tok_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Recipe "Adding a dataset": a declaration registered in `DATASETS` is all the plan, its checks, the
    workload's label and a point's prompts need (nothing in compare/ names a dataset)."""
    from transformers import AutoTokenizer

    class Short(Generated):
        name = "short"
        about = "random prompts of 4 tokens"
        options = reads(output_len=length("output tokens"))

        def label(self, w: Workload) -> str:
            return f"short-{w.output_len}"

        def chunks(
            self,
            w: Workload,
            tokenizer: Any,
            seed: Sequence[int],
            size: int,
            allowed: Callable[[], np.ndarray],
            id_prefix: str,
        ) -> Callable[[int], list]:
            return lambda c: random_dataset(
                tokenizer, size, 4, w.output_len, seed=[*seed, c], id_prefix=id_prefix, first_index=c * size
            )

    monkeypatch.setitem(DATASETS, "short", Short())
    options = {
        "backends": "vllm",
        "endpoints": ["vllm=http://127.0.0.1:9"],
        "model": "m",
        "tokenizer": str(tok_dir),
        "dataset": "short",
        "num_requests": 3,
    }
    for wrong, message in [
        ({"input_len": "8"}, "--input-len does not apply to dataset short"),
        ({"output_len": "0"}, "--output-len: fixed length needs a first value >= 1"),
        ({"dataset_path": str(tok_dir)}, "dataset short makes its own prompts"),
    ]:
        with pytest.raises(PlanError, match=message):
            build_plan(options | wrong)
    plan = build_plan(options | {"output_len": "2"})
    [workload] = plan.workloads
    assert (workload.label, workload.sessions, workload.prefix_len) == ("short-2", False, None)
    prompts = Prompts(plan, AutoTokenizer.from_pretrained(str(tok_dir)), FixedPoints.most_points(plan))
    [(_, [stream, *_])] = prompts.workloads
    made = stream.first(3)
    assert [(s.request_id, s.prompt_len, s.wanted_output_tokens) for s in made] == [
        ("short0-0", 4, 2),
        ("short0-1", 4, 2),
        ("short0-2", 4, 2),
    ]


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
        columns = {
            f"{m.name}_n",
            f"{m.name}_mean_ms",
            f"{m.name}_p50_ms",
            f"{m.name}_p99_ms",
            f"{m.name}_p50_ms_lo",
            f"{m.name}_p50_ms_hi",
        }
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
    assert (
        report.index("## Decision")
        < report.index("## Backends measured\n\n- a\n- b")
        < report.index("## Warnings")
    )
    assert "<h2>Backends measured</h2>" in (results.run.path / "report.html").read_text()
