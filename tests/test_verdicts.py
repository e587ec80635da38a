"""The Decision's sentences as strong as their evidence: the confidence ladder's rule with real counts,
failures before numbers and never a slower winner called faster, a candidate the run never reached named as
not measured, throughput ranked at closed-loop points, qualifiers carried by the verdict, set-up gaps and
pay-backs from one launch never established (and rounded up), multi-turn points cut by the duration warned
about, and turns numbered from 1 in turns.csv as in the report."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from test_compare_report import make_run, requests_for
from test_duration_cut_warning import summary_of

from compare.analysis.caveats import duration_cut_qualifiers
from compare.analysis.confidence import (
    Confidence,
    Qualifier,
    bracket_verdict,
    qualifier_sentence,
    qualifiers_for,
    verdict,
)
from compare.analysis.costs import break_even
from compare.analysis.results import analyze
from compare.analysis.selection import setup_gap, throughput_pick
from compare.analysis.turns import TURN, turn_table
from compare.common.datatypes import SetupReport
from compare.measure.run_dir import RunDir
from compare.report.render import to_markdown
from compare.report.sections import build_blocks
from compare.report.write import write_reports
from workloads.records import RecordWriter


def test_small_samples_give_their_real_counts_and_one_word():
    found = verdict(1.5, 6.0, (5, 16), [], 0.0005, "95% CI 1.50-6.00x")
    assert found.level is Confidence.NOT_ESTABLISHED
    assert found.words().startswith("not established (5 and 16 requests: at least 10 each are needed")
    assert "fewer than" not in found.words()


@pytest.mark.parametrize(
    "lo, hi, launches, level",
    [
        (1.05, 1.20, [], Confidence.INDICATED),  # one launch each: never established
        (1.05, 1.20, [1.1, 1.12], Confidence.ESTABLISHED),
        (1.05, 1.20, [1.1, 0.97], Confidence.NOT_ESTABLISHED),  # a launch disagrees
        (0.95, 1.20, [1.1, 1.12], Confidence.NOT_ESTABLISHED),  # the interval holds 1
        (0.99, 1.01, [1.01, 1.0], Confidence.TIE),
        (1.005, 1.015, [1.01, 1.01], Confidence.TIE),  # excludes 1, but not by the tie margin
    ],
)
def test_the_ladder(lo, hi, launches, level):
    assert verdict(lo, hi, (40, 40), launches).level is level


def _break(run: RunDir, backend: str, ends: tuple[str, ...]) -> None:
    lines = []
    for line in run.requests_path.read_text().splitlines():
        obj = json.loads(line)
        if obj["backend"] == backend and obj["request_id"].endswith(ends):
            obj.update(error_kind="connection_reset", error_message="reset", events=[], http_status=None)
        lines.append(json.dumps(obj))
    run.requests_path.write_text("\n".join(lines) + "\n")


def test_a_failing_faster_backend_comes_first_and_the_winner_is_called_slower(tmp_path):
    """`fast` fails half its requests at every point; `slow` wins by having none, and the sentence says the
    failures first, then that the winner is slower (a ratio below 1 is never "faster")."""
    run = make_run(tmp_path / "run", {"fast:": 0.01, "slow:": 0.05})
    _break(run, "fast", tuple(f"-{i}" for i in range(0, 30, 2)))
    results = analyze(run, n_boot=100)
    interactive = " ".join(results.picks[0].sentences)
    assert results.picks[0].winner == "slow" and not results.picks[0].decisive
    failures = interactive.index("fast is ranked after the candidates without failures: 15 of 30 requests")
    assert failures < interactive.index("**slow**") < interactive.index("slower than fast")
    assert "faster than fast" not in interactive and "x faster" not in interactive
    throughput = " ".join(results.picks[1].sentences)
    assert throughput.index("fast failed requests at every load point") < throughput.index("**slow**")
    assert "less than fast's" in throughput


def test_a_candidate_the_run_never_reached_is_named_not_measured(tmp_path):
    run = make_run(tmp_path / "run", {"reference:graphs": 0.05})
    run.manifest["config"]["backends"] = [{"key": "reference:graphs"}, {"key": "vllm"}]
    run.save()
    decision = " ".join(s for p in analyze(RunDir.open(run.path), n_boot=50).picks for s in p.sentences)
    assert "vllm was not measured (the run ended before its turn)" in decision
    assert "only candidate" not in decision


def _row(key: str, point: str, mode: str, rate: float) -> dict[str, object]:
    return {
        "workload": "wl",
        "backend": key,
        "variant": "",
        "load_point": point,
        "mode": mode,
        "output_tok_s": rate,
        "requests_failed": 0,
        "requests": 40,
        "requests_ok": 40,
        "errors": "",
        "output_tok_s_lo": np.nan,
        "output_tok_s_hi": np.nan,
    }


def test_throughput_is_ranked_at_closed_loop_points_where_every_candidate_has_one():
    """Open-loop points are faster here (the offered load sets their rate): ranked at c=8 all the same, so
    the verdict is never 'the offered load sets the rate'."""
    summary = pd.DataFrame(
        [
            _row("a", "c=8", "closed", 300.0),
            _row("a", "r=50", "open", 900.0),
            _row("b", "c=8", "closed", 200.0),
            _row("b", "r=50", "open", 950.0),
        ]
    )
    pick = throughput_pick(summary, "wl", {}, None)
    assert (pick.winner, pick.load_point, pick.runner_up) == ("a", "c=8", "b")
    assert "offered load sets the rate" not in " ".join(pick.sentences)


def test_qualifiers_reach_the_verdicts_they_touch_and_no_other():
    found = [
        Qualifier("repeated prompts", "a c=16: 90 of 100", ("a",), "wl", "c=16"),
        Qualifier("repeated prompts", "a c=1: 3 of 40", ("a",), "wl", "c=1"),
        Qualifier("unequal settings", "front ends: a 4, b 1", ("a", "b"), between=True),
        Qualifier("unequal settings", "dtype: a fp16, c fp32", ("a", "c"), between=True),
        Qualifier("token counts", "a c=16: re-tokenised", ("a",), "wl", "c=16", verdict=False),
    ]
    touched = qualifiers_for(found, "wl", {"a": "c=16", "b": "c=16"})
    assert [q.text for q in touched] == ["a c=16: 90 of 100", "front ends: a 4, b 1"]
    assert qualifier_sentence(touched) == (
        "Qualified by repeated prompts (a c=16: 90 of 100); unequal settings (front ends: a 4, b 1)."
    )


def _setup(key: str, *ready: float) -> SetupReport:
    s = SetupReport(key, "", "process", "http://x", ready_s=float(np.median(ready)))
    s.ready_runs = list(ready) if len(ready) > 1 else []
    return s


def test_a_start_up_gap_from_one_launch_is_never_established():
    assert setup_gap(_setup("a", 8.1), _setup("b", 13.1)).level is Confidence.INDICATED
    overlapping = setup_gap(_setup("a", 13.1, 9.7, 4.4), _setup("b", 8.1, 3.5, 4.6))
    assert overlapping.level is Confidence.NOT_ESTABLISHED and "overlap" in overlapping.reason
    apart = setup_gap(_setup("a", 3.0, 3.4), _setup("b", 9.0, 9.6))
    assert apart.level is Confidence.ESTABLISHED


def test_pay_back_rounds_up():
    """2.07 requests to catch up is 3 requests: after 2 it has not yet paid back."""
    be = break_even(2.07, 0.0, 1.0, 2.0)
    assert be.requests == 3 and "after 3 requests" in be.verdict
    assert break_even(2.0, 0.0, 1.0, 2.0).requests == 2


def test_the_decision_says_a_pay_back_from_one_launch_each_is_not_established(tmp_path):
    setups = {
        "reference:graphs": SetupReport("reference", "graphs", "process", "http://x", ready_s=20.0),
        "reference:eager": SetupReport("reference", "eager", "process", "http://y", ready_s=8.0),
    }
    run = make_run(tmp_path / "run", {"reference:graphs": 0.05, "reference:eager": 0.06}, setups)
    write_reports(analyze(run, n_boot=100))
    report = (run.path / "report.md").read_text()
    decision = report.split("## Decision", 1)[1].split("## Warnings", 1)[0]
    assert "from one launch each" in decision and "it would pay back after" in decision
    assert "it pays back" not in decision
    table = report.split("## Set-up cost against latency", 1)[1].split("\n## ", 1)[0]
    assert "indicated, not established" in table


def _session_run(tmp_path, turns_sent: list[int], wall_s: float) -> RunDir:
    config = {
        "model": "m",
        "slo_s": {},
        "num_requests": 4,
        "duration_s": 10.0,
        "repeats": 1,
        "workloads": [{"dataset": "multi-turn", "turns": 4, "label": "multi-turn-4x8x8"}],
    }
    run = RunDir.create(tmp_path / "run", config, ["compare", "run"])
    run.add_point("p1", "reference", "", "multi-turn-4x8x8", "c=2", {"kind": "closed", "concurrency": 2})
    records = requests_for("reference", "", "p1", "c=2", sum(turns_sent), 0.01)
    with RecordWriter(run.requests_path) as writer, RecordWriter(run.runs_path) as runs:
        i = 0
        for session, sent in enumerate(turns_sent):
            for turn in range(sent):
                writer.append(
                    records[i].model_copy(
                        update={
                            "session_id": f"s-{session}",
                            "turn": turn,
                            "request_id": f"s-{session}-t{turn}",
                        }
                    )
                )
                i += 1
        summary = summary_of("p1", "c=2", sum(turns_sent), wall_s)
        runs.append(summary.model_copy(update={"backend": "reference", "variant": ""}))
    run.manifest["status"] = "complete"
    run.save()
    return RunDir.open(run.path)


@pytest.mark.parametrize(
    "turns_sent, wall_s, warned", [([4, 2], 11.0, True), ([4, 4], 11.0, False), ([4, 2], 5.0, False)]
)
def test_a_multi_turn_point_cut_by_its_duration_is_warned_about(tmp_path, turns_sent, wall_s, warned):
    """Two sessions of 4 turns, 4 requests asked: the second stopped after 2 turns when the duration ended
    the point. The request count alone (6 >= 4) would hide it."""
    run = _session_run(tmp_path, turns_sent, wall_s)
    found = duration_cut_qualifiers(run)
    assert bool(found) is warned
    if warned:
        assert "1 of 2 sessions had not sent all 4 turns (2 at fewest)" in found[0].detail
        results = analyze(run, n_boot=50)
        assert "points cut short" in to_markdown(build_blocks(results)).split("## Warnings", 1)[1]


def test_turns_are_numbered_from_one_in_turns_csv_as_in_the_report(tmp_path):
    run = _session_run(tmp_path, [3, 3], 5.0)
    results = analyze(run, n_boot=50)
    table = turn_table(results.requests)
    assert table[TURN].tolist() == [1, 2, 3]
    section = to_markdown(build_blocks(results)).split("## TTFT by turn", 1)[1].split("\n## ", 1)[0]
    rows = [line.split(" | ")[3] for line in section.splitlines() if line.startswith("| reference")]
    assert rows == ["1", "2", "3"]


def test_a_point_cut_short_is_said_in_the_verdict_before_its_numbers(tmp_path):
    config = {"model": "m", "slo_s": {}, "num_requests": 16, "duration_s": 30.0, "repeats": 1}
    run = RunDir.create(tmp_path / "run", config, ["compare", "run"])
    run.add_point("p1", "reference", "eager", "wl", "c=1", {"kind": "closed", "concurrency": 1})
    with RecordWriter(run.requests_path) as writer, RecordWriter(run.runs_path) as runs:
        for record in requests_for("reference", "eager", "p1", "c=1", 7, 0.2):
            writer.append(record)
        runs.append(summary_of("p1", "c=1", 7, 31.0))
    run.manifest["status"] = "complete"
    run.save()
    interactive = analyze(RunDir.open(run.path), n_boot=50).picks[0].sentences[0]
    assert interactive.startswith(
        "**Interactive** (wl, c=1): Points cut short (c=1 on reference:eager: 7 of 16 requests before the "
        "30 s "
        "duration). **reference:eager** has the lowest median"
    ), interactive


def test_capacity_brackets_from_one_search_each_are_indicated_at_most():
    assert bracket_verdict([True]).level is Confidence.INDICATED
    assert bracket_verdict([True, True]).level is Confidence.ESTABLISHED
    assert bracket_verdict([True, False]).level is Confidence.NOT_ESTABLISHED
    assert bracket_verdict([]).level is Confidence.NOT_ESTABLISHED


def test_goodput_at_an_open_loop_point_is_never_more_than_was_offered():
    """1.34 requests/s within the SLOs measured over a short window at r=0.95 is sampling noise of a few
    arrivals: the decision reports the share within the SLOs times the offered rate, at most 0.95."""
    rows = [
        {**_row("a", "r=0.95", "open", 50.0), "goodput_rps": 1.34, "goodput_frac": 0.9, "offered_rps": 0.95},
        {**_row("b", "r=0.95", "open", 40.0), "goodput_rps": 0.5, "goodput_frac": 0.5, "offered_rps": 0.95},
    ]
    pick = throughput_pick(pd.DataFrame(rows), "wl", {"ttft": 0.1}, None)
    assert pick.winner == "a" and pick.value == pytest.approx(0.855)
    assert "reaches 0.85 requests/s within the SLOs" in " ".join(pick.sentences)


def _two_launch_run(tmp_path, tpots: dict[str, float], ready: dict[str, tuple[float, float]]) -> RunDir:
    """Two launches each, in alternating order, 30 requests a launch with 3 % noise per request."""
    run = RunDir.create(tmp_path / "run", {"model": "m", "repeats": 2}, ["compare", "run"])
    rng = np.random.default_rng(7)
    with RecordWriter(run.requests_path) as writer:
        for repeat in (0, 1):
            for backend in list(tpots)[:: 1 if repeat == 0 else -1]:
                run_id = f"{backend}-{repeat}"
                run.add_point(run_id, backend, "", "wl", "c=1", {"kind": "closed", "concurrency": 1}, repeat)
                for record in requests_for(backend, "", run_id, "c=1", 30, tpots[backend], rng):
                    writer.append(record)
    for backend, times in ready.items():
        for repeat, seconds in enumerate(times):
            run.set_setup(SetupReport(backend, "", "process", "http://x", ready_s=seconds, repeat=repeat))
    run.manifest["status"] = "complete"
    run.save()
    return RunDir.open(run.path)


def test_established_through_the_whole_decision_needs_both_launches_and_a_start_up_gap_apart(tmp_path):
    """a is 15 % faster in each of two alternating launches and starts 10 s later in both: the decision
    calls the difference established, and the pay-back too (the launches' start-up ranges do not overlap)."""
    run = _two_launch_run(tmp_path, {"a": 0.05, "b": 0.06}, {"a": (20.0, 21.0), "b": (10.0, 11.0)})
    results = analyze(run, n_boot=200)
    interactive = results.picks[0]
    assert (interactive.winner, interactive.level) == ("a", "established") and interactive.decisive
    text = " ".join(interactive.sentences)
    assert "established (ahead in each of 2 launches" in text
    assert "it pays back after" in text and "the launches' ranges do not overlap" in text
