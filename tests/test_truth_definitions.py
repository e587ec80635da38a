"""benchmarks/truth: each client's definitions applied to a known server log, and the importers of the
clients' own output files (vLLM bench JSON, AIPerf JSONL, GuideLLM JSON) read back into errors against that
truth."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.truth import importers
from benchmarks.truth.definitions import compare, true_metrics, truth_from_log
from instruments.scripted_server import ScriptedSchedule

ROLE_LOG = {
    "request_id": "r0",
    "received_s": 100.0,
    "events": [
        [100.001, 0, "role"],
        [100.1, 1, "token"],
        [100.11, 1, "token"],
        [100.12, 1, "token"],
        [100.121, 0, "usage"],
        [100.122, 0, "done"],
    ],
}


def approx(values, expected):
    return values == pytest.approx(expected, abs=1e-9)


def test_role_chunk_definitions():
    truth = truth_from_log(ROLE_LOG, ScriptedSchedule())
    ours, vllm = true_metrics(truth, "ours"), true_metrics(truth, "vllm")
    aiperf, guidellm = true_metrics(truth, "aiperf"), true_metrics(truth, "guidellm")
    assert approx(ours["ttft"], 0.1) and approx(ours["tpot"], 0.01) and approx(ours["itl"], [0.01, 0.01])
    # vLLM bench: the role-only chunk has a non-empty `choices` list: it is the "first token"
    assert approx(vllm["ttft"], 0.001) and approx(vllm["tpot"], 0.119 / 2)
    assert approx(vllm["itl"], [0.099, 0.01, 0.01])
    assert approx(aiperf["ttft"], 0.1) and approx(aiperf["itl"], [0.01, 0.01])
    # GuideLLM: TPOT includes TTFT; ITL is one mean per request
    assert approx(guidellm["ttft"], 0.1) and approx(guidellm["tpot"], 0.12 / 3)
    assert approx(guidellm["itl"], [0.01])


def test_empty_text_and_multi_token_definitions():
    log = {"request_id": "e", "received_s": 0.98, "events": [[1.0 + 0.01 * i, 1, "token"] for i in range(4)]}
    truth = truth_from_log(log, ScriptedSchedule(empty_text_every=2))  # tokens 1 and 3 have empty text
    assert [e.empty_text for e in truth.events] == [False, True, False, True]
    assert approx(true_metrics(truth, "vllm")["itl"], [0.01] * 3)
    aiperf = true_metrics(truth, "aiperf")
    assert approx(aiperf["itl"], [0.02]) and approx(aiperf["tpot"], 0.02 / 3)
    multi = truth_from_log(
        {"request_id": "m", "received_s": 0.9, "events": [[1.0, 2, "token"], [1.04, 2, "token"]]},
        ScriptedSchedule(tokens_per_event=2),
    )
    assert approx(true_metrics(multi, "ours")["itl"], [0.02, 0.02])  # per token: k gaps of gap/k
    assert approx(true_metrics(multi, "vllm")["itl"], [0.04])  # per chunk


def test_importers_read_each_clients_output_and_pair_it(tmp_path):
    truths = {
        "truth-0": truth_from_log({**ROLE_LOG, "request_id": "truth-0"}, ScriptedSchedule()),
        "scripted-7": truth_from_log({**ROLE_LOG, "request_id": "scripted-7"}, ScriptedSchedule()),
    }
    # vLLM bench: lists in input order, ids from --request-id-prefix; 2 ms late on the first chunk only
    (tmp_path / "vllm.json").write_text(
        json.dumps(
            {
                "ttfts": [0.003, 0.0],
                "itls": [[0.097, 0.01, 0.01], []],
                "latencies": [0.12, 0.0],
                "output_lens": [3, 0],
                "errors": ["", "boom"],
            }
        )
    )
    measured = list(importers.vllm_bench(tmp_path / "vllm.json", "truth-"))
    assert [m.request_id for m in measured] == ["truth-0"]
    errors = compare(measured, truths, "vllm").summary()
    assert errors["requests"] == 1 and errors["ttft_p99_ms"] == pytest.approx(2.0)
    assert errors["itl_max_ms"] == pytest.approx(2.0) and errors["tpot_max_ms"] == pytest.approx(1.0)
    # ...and against the declared definition its TTFT is 97 ms short: the role chunk
    assert errors["ttft_declared_p99_diff_ms"] == pytest.approx(-97.0)

    # AIPerf: X-Request-ID in each record's metadata, values in ms, warm-up records skipped
    record = {
        "metadata": {"x_request_id": "truth-0", "benchmark_phase": "profiling"},
        "metrics": {
            "time_to_first_token": {"value": 100.0, "unit": "ms"},
            "inter_token_latency": {"value": 10.0, "unit": "ms"},
            "inter_chunk_latency": {"value": [10.0, 10.0], "unit": "ms"},
        },
    }
    warm = {**record, "metadata": {"x_request_id": "w", "benchmark_phase": "warmup"}}
    (tmp_path / "aiperf.jsonl").write_text(json.dumps(record) + "\n" + json.dumps(warm) + "\n")
    errors = compare(importers.aiperf(tmp_path / "aiperf.jsonl"), truths, "aiperf").summary()
    assert errors["requests"] == 1 and errors["ttft_max_ms"] == pytest.approx(0.0, abs=1e-6)
    assert errors["itl_n"] == 2 and errors["tpot_max_ms"] == pytest.approx(0.0, abs=1e-6)

    # GuideLLM: the server's chunk id as response_id; requests outside the measured window are skipped
    def req(rid: str, start: float) -> dict:
        return {
            "response_id": f"chatcmpl-{rid}",
            "request_start_time": start,
            "request_end_time": start + 0.12,
            "time_to_first_token_ms": 101.0,
            "time_per_output_token_ms": 40.0,
            "inter_token_latency_ms": 10.0,
        }

    (tmp_path / "guidellm.json").write_text(
        json.dumps(
            {
                "benchmarks": [
                    {
                        "start_time": 10.0,
                        "end_time": 20.0,
                        "requests": {"successful": [req("scripted-7", 10.0), req("truth-0", 1.0)]},
                    }
                ]
            }
        )
    )
    measured = list(importers.guidellm(tmp_path / "guidellm.json"))
    assert [m.request_id for m in measured] == ["scripted-7"]
    errors = compare(measured, truths, "guidellm").summary()
    assert errors["ttft_max_ms"] == pytest.approx(1.0)
    assert errors["tpot_max_ms"] == pytest.approx(0.0, abs=1e-6)
    assert errors["itl_n"] == 1
