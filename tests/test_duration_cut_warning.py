"""A load point that `--duration` ended before its `--num-requests` is named under Warnings (and so in the
CLI's output), with how many of the requests it got."""

from __future__ import annotations

import pytest
from test_compare_report import requests_for

from compare.analysis.results import analyze
from compare.measure.run_dir import RunDir
from compare.report.render import to_markdown
from compare.report.sections import build_blocks
from workloads.records import RecordWriter, RunSummary


def summary_of(run_id: str, point: str, n: int, wall_s: float, interrupted: bool = False) -> RunSummary:
    return RunSummary(
        run_id=run_id,
        backend="reference",
        variant="eager",
        load_point=point,
        t0_monotonic=1000.0,
        schedule={"kind": "closed", "concurrency": 1},
        measured_start_s=0.5,
        wall_s=wall_s,
        n_warmup=1,
        n_measured=n,
        n_sent=n,
        n_ok=n,
        errors={},
        offered_rate=None,
        achieved_rate=None,
        lag_p50_s=0.0,
        lag_p99_s=0.0,
        lag_max_s=0.0,
        interrupted=interrupted,
    )


@pytest.mark.parametrize(
    "n, wall_s, interrupted, warned",
    [
        (7, 31.0, False, True),  # the duration ended it at 7 of 16
        (16, 31.0, False, False),  # all 16 arrived, whatever the time
        (7, 12.0, False, False),  # it ended before the duration: not the duration's doing
        (7, 31.0, True, False),  # Ctrl-C: the interruption warning covers it
    ],
)
def test_a_point_cut_short_by_the_duration_is_warned_about(tmp_path, n, wall_s, interrupted, warned):
    config = {"model": "m", "slo_s": {}, "num_requests": 16, "duration_s": 30.0, "repeats": 1}
    run = RunDir.create(tmp_path / "run", config, ["compare", "run"])
    run.add_point("p1", "reference", "eager", "wl", "c=1", {"kind": "closed", "concurrency": 1})
    with RecordWriter(run.requests_path) as writer, RecordWriter(run.runs_path) as runs:
        for record in requests_for("reference", "eager", "p1", "c=1", n, 0.2):
            writer.append(record)
        runs.append(summary_of("p1", "c=1", n, wall_s, interrupted))
    run.manifest["status"] = "complete"
    run.save()
    results = analyze(RunDir.open(run.path), n_boot=50)
    text = "c=1 on reference:eager (wl): 7 of 16 requests before the 30 s duration ended the point"
    assert any(text in w for w in results.warnings) is warned
    assert (text in to_markdown(build_blocks(results))) is warned


@pytest.mark.parametrize("repeats", [0, 5])
def test_a_point_that_reused_its_prompts_is_warned_about(tmp_path, repeats):
    """The load generator cycles a point's prompts (ids `~k`) once it has sent them all: the report says how
    many requests were repeats, which a prefix cache answers."""
    config = {"model": "m", "slo_s": {}, "num_requests": None, "duration_s": 10.0, "repeats": 1}
    run = RunDir.create(tmp_path / "run", config, ["compare", "run"])
    run.add_point("p1", "reference", "eager", "wl", "c=4", {"kind": "closed", "concurrency": 4})
    records = requests_for("reference", "eager", "p1", "c=4", 12, 0.2)
    distinct = len(records) - repeats
    with RecordWriter(run.requests_path) as writer, RecordWriter(run.runs_path) as runs:
        for i, record in enumerate(records):
            if i >= distinct:  # the first prompts sent again, as `_items` names them
                record = record.model_copy(update={"request_id": f"{records[i - distinct].request_id}~1"})
            writer.append(record)
        runs.append(summary_of("p1", "c=4", len(records), 9.0))
    run.manifest["status"] = "complete"
    run.save()
    results = analyze(RunDir.open(run.path), n_boot=50)
    text = (
        f"reference:eager c=4: {repeats} of 12 requests repeated a prompt this point had sent "
        f"({distinct} distinct)"
    )
    assert any(text in w for w in results.warnings) is bool(repeats)


@pytest.mark.parametrize(
    "n, wall_s, warned",
    [
        (5, 16.0, True),  # the block's own 15 s ended it at 5 of its 8
        (8, 16.0, False),  # it got its 8
        (5, 9.0, False),  # it ended before its duration
    ],
)
def test_a_block_is_judged_by_its_own_bounds(tmp_path, n, wall_s, warned):
    """A point measured in two blocks gives each half the requests and half the duration (the manifest's
    point entry says so): a block is cut short against those, not against the whole point's."""
    config = {"model": "m", "slo_s": {}, "num_requests": 16, "duration_s": 30.0, "repeats": 1, "blocks": 2}
    run = RunDir.create(tmp_path / "run", config, ["compare", "run"])
    run.add_point("p1", "reference", "eager", "wl", "c=1", {"kind": "closed", "concurrency": 1})
    run.manifest["points"][-1].update({"block": 0, "blocks": 2, "num_requests": 8, "duration_s": 15.0})
    with RecordWriter(run.requests_path) as writer, RecordWriter(run.runs_path) as runs:
        for record in requests_for("reference", "eager", "p1", "c=1", n, 0.2):
            writer.append(record)
        runs.append(summary_of("p1", "c=1", n, wall_s))
    run.manifest["status"] = "complete"
    run.save()
    results = analyze(RunDir.open(run.path), n_boot=50)
    text = "c=1 on reference:eager (wl): 5 of 8 requests before the 15 s duration ended the point"
    assert any(text in w for w in results.warnings) is warned
