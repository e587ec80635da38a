"""The terminal at 80 columns: every help text whole, the summary table with no cell cut short; and feedback
for the waits of a run (checkpoint preparation, server start-up, warm-up, a refused connection)."""

from __future__ import annotations

import contextlib
import http.server
import io
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd
import pytest
import typer
from rich.console import Console
from rich.text import Text
from test_compare_report import requests_for
from typer.testing import CliRunner

import compare.cli as cli
from compare import terminal
from compare.cli import app
from compare.launch import launcher as launching
from compare.measure import model
from compare.measure.loop import Launch
from compare.measure.point import Point
from compare.measure.run_dir import RunDir
from compare.measure.watcher import Watcher

runner = CliRunner()
BOX = re.compile(r"[\u2500-\u257f]")  # box-drawing characters of rich's panels


def flat(text: str) -> str:
    """Text as words: box characters dropped, whitespace collapsed, so that wrapping does not matter."""
    return " ".join(BOX.sub(" ", text).split())


def _commands() -> list[tuple[list[str], Any]]:
    """Every command of the app (typer's own click command objects), with the words that call it."""
    group: Any = typer.main.get_command(app)
    return [([], group)] + [([name], cmd) for name, cmd in group.commands.items()]


def _id(value: Any) -> str:
    return "-".join(value) if isinstance(value, list) else ""


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("path, command", _commands(), ids=_id)
def test_every_help_text_is_whole_at_80_columns(path, command, width):
    """Each option's and argument's help, and the command's own text (the exit codes of `run` among it),
    appear in full: wrapped at the width, never cut with an ellipsis."""
    result = runner.invoke(app, [*path, "--help"], env={"COLUMNS": str(width), "TERMINAL_WIDTH": ""})
    assert result.exit_code == 0, result.output
    out = result.output
    assert max(len(line) for line in out.splitlines()) <= width
    assert "…" not in out
    shown = flat(out)
    texts = [p.help for p in command.params if getattr(p, "help", None)]
    texts += [p for p in (command.help or "").split("\n\n") if p.strip()]
    assert texts
    for text in texts:
        assert flat(Text.from_markup(text).plain) in shown, text
    if path == ["run"]:
        assert "130 interrupted by Ctrl-C or SIGTERM" in shown


def test_run_help_paragraphs_are_reflowed_not_broken_at_the_source_lines():
    """At 80 columns the exit codes read as one paragraph: no line ends far short of the width while the
    paragraph goes on (the docstring's own line breaks used to leave half-empty lines)."""
    out = runner.invoke(app, ["run", "--help"], env={"COLUMNS": "80"}).output
    head = out.split("╭")[0].splitlines()
    exit_lines = [line.rstrip() for line in head if line.strip()]
    start = next(i for i, line in enumerate(exit_lines) if "Exit codes" in line)
    paragraph = exit_lines[start:]
    assert len(paragraph) >= 3
    for line in paragraph[:-1]:
        assert len(line) >= 60, paragraph


# -- the summary table ---------------------------------------------------------------------------------------

BACKENDS = [
    ("reference", "eager"),
    ("reference", ""),
    ("vllm", "tp2"),
    ("llama.cpp", ""),
    ("trtllm-triton", "fp8"),
    ("sglang", ""),
]
LOADS = ["c=1", "c=64", "r=12.5", "r=inf", "trace=burst.jsonl"]
MEASURED = ["ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "e2e_p50_ms", "output_tok_s"]


def _summary(seed: int) -> pd.DataFrame:
    """A summary of random backends, load points and magnitudes (0.01 ms to 100 s, up to 10,000 requests)."""
    rng = np.random.default_rng(seed)
    rows = []
    for workload in rng.choice(
        ["random-128x16", "sharegpt-ShareGPT_V3_unfiltered", "prefix-4x256+128x16"],
        size=rng.integers(1, 3),
        replace=False,
    ):
        for b in rng.choice(len(BACKENDS), size=rng.integers(1, len(BACKENDS) + 1), replace=False):
            for load in rng.choice(LOADS, size=rng.integers(1, 4), replace=False):
                rows.append(
                    {
                        "backend": BACKENDS[b][0],
                        "variant": BACKENDS[b][1],
                        "workload": workload,
                        "load_point": load,
                        "requests_ok": int(rng.integers(0, 10_000)),
                        "requests_failed": int(rng.integers(0, 100)),
                        "requests_cancelled": int(rng.integers(0, 10)),
                        "goodput_rps": np.nan if seed % 2 else float(rng.uniform(0, 500)),
                    }
                    | {m: float(10 ** rng.uniform(-2, 5)) for m in MEASURED}
                )
    return pd.DataFrame(rows)


def _labelled(lines: list[str], key: str, load: str) -> bool:
    """Whether a row starts with the backend `key` whole and then `load` whole, on its line or the next."""
    words = [line.split() for line in lines] + [[]]
    return any(
        w[:1] == [key] and (w[1:2] == [load] or words[i + 1][:1] == [load]) for i, w in enumerate(words[:-1])
    )


@pytest.mark.parametrize("width", [80, 100, 160])
@pytest.mark.parametrize("seed", range(6))
def test_the_summary_fits_the_terminal_with_every_name_whole(monkeypatch, seed, width):
    """At 80 columns and more: no cell cut with an ellipsis, no line wider than the terminal, every backend
    name and load point readable whole, every workload named, every row's TTFT p50 shown."""
    summary = _summary(seed)
    shown = Console(width=width, record=True, file=io.StringIO())
    monkeypatch.setattr(cli, "console", shown)
    cli.print_summary(SimpleNamespace(summary=summary, picks=[], warnings=["a warning"]))
    text = shown.export_text()
    lines = text.splitlines()
    assert "…" not in text
    assert max(map(len, lines)) <= width
    for _, r in summary.iterrows():
        key = f"{r['backend']}:{r['variant']}" if r["variant"] else r["backend"]
        assert _labelled(lines, key, r["load_point"]), (key, r["load_point"])
        assert terminal._short(r["ttft_p50_ms"]) in text
    for workload in summary["workload"].unique():
        assert workload in flat(text)
    assert ("goodput" in text) == bool(summary["goodput_rps"].notna().any())
    assert "warning: a warning" in text


def test_short_numbers_keep_three_significant_digits():
    for value, shown in [
        (0.0123, "0.01"),
        (4.126, "4.13"),
        (45.66, "45.7"),
        (123.4, "123"),
        (12345.6, "12,346"),
        (float("nan"), "–"),
        (None, "–"),
    ]:
        assert terminal._short(value) == shown


# -- waits: a refused connection, a server's start-up, the checkpoint, the warm-up ---------------------------


class Heard:
    """A Watcher that keeps what it is told: messages, each wait's title and states, each point's phases."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.waits: list[tuple[str, list[str]]] = []
        self.phases: list[str] = []

    @contextlib.contextmanager
    def _wait(self, title: str) -> Iterator[Any]:
        states: list[str] = []
        self.waits.append((title, states))
        yield states.append

    @contextlib.contextmanager
    def _point(self, _title: str, _total: int | None) -> Iterator[Any]:
        yield lambda _done, _rate, _errors, phase: self.phases.append(phase)

    def watcher(self) -> Watcher:
        return Watcher(say=self.said.append, point=self._point, wait=self._wait)


def test_a_refused_endpoint_fails_at_once_naming_the_url(monkeypatch):
    """Nothing listens at the endpoint: the error says "connection refused" and the URL after a few checks
    within `REFUSED_GRACE_S`, not after the 60 s health timeout (bound: 10 s, for a busy machine)."""
    url = f"http://127.0.0.1:{launching.free_port()}"  # bound once, then closed: nothing listens there
    checks = []
    real = launching.check_health
    monkeypatch.setattr(launching, "check_health", lambda *a, **k: checks.append(a) or real(*a, **k))
    started = time.monotonic()
    with pytest.raises(launching.LaunchError) as info:
        launching.endpoint_report("vllm", "", url, "/health", timeout=60.0)
    assert time.monotonic() - started < 10.0
    assert "connection refused" in str(info.value) and f"{url}/health" in str(info.value)
    assert 1 <= len(checks) <= 1 + launching.REFUSED_GRACE_S / 0.1 + 1


@contextlib.contextmanager
def _answering(status: int) -> Iterator[str]:
    """A server on loopback whose every GET answers `status`."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(status)
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_an_endpoint_that_answers_but_not_healthy_is_waited_for_and_says_how_it_answered():
    answer = r"no healthy answer .* within 1 s \(last: HTTP 503\)"
    unhealthy = pytest.raises(launching.LaunchError, match=answer)
    with _answering(503) as url, unhealthy:
        launching.endpoint_report("vllm", "", url, "/health", timeout=1.0)
    with _answering(200) as url:
        assert launching.endpoint_report("vllm", "", url, "/health", timeout=5.0).url == url


SLOW_SERVER = """
import http.server, logging, sys, time
logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
log = logging.getLogger("reference_engine")
log.info("tokenizer loaded in 0.01 s")
log.info("weights loaded: 0.5 GiB, float32 on cpu in 0.02 s")
time.sleep(1.5)  # still starting: nothing listens yet

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()

server = http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), Health)
log.info("server ready at http://127.0.0.1:%s in 1.6 s", sys.argv[1])
server.serve_forever()
"""


def test_a_launched_server_is_polled_through_refusals_and_its_state_is_shown(tmp_path):
    """Refused connections are expected while a launched server starts: polling goes on, and the state
    heard says it is not listening yet and which start-up phase its log reports."""
    port = launching.free_port()
    launcher = launching.ProcessLauncher(
        "reference",
        "",
        launching.ServerProcess([sys.executable, "-c", SLOW_SERVER, str(port)]),
        f"http://127.0.0.1:{port}",
        "/health",
        tmp_path / "server.log",
        startup_timeout=60,
    )
    states: list[str] = []
    with launcher:
        report = launcher.start(on_wait=states.append)
    assert report.ready_s is not None and report.ready_s >= 1.5
    assert any("not listening yet" in s for s in states), states
    assert any(s.startswith("weights done") for s in states), states


def test_a_launched_server_that_exits_stops_the_wait_at_once(tmp_path):
    """The process exited while refused: the error comes then, not after the start-up timeout (600 s;
    bound: 30 s for a busy machine)."""
    cmd = [
        sys.executable,
        "-c",
        "import time, sys; print('no GPU', flush=True); time.sleep(0.3); sys.exit(4)",
    ]
    port = launching.free_port()
    launcher = launching.ProcessLauncher(
        "reference",
        "",
        launching.ServerProcess(cmd),
        f"http://127.0.0.1:{port}",
        "/health",
        tmp_path / "x.log",
        startup_timeout=600,
    )
    started = time.monotonic()
    with pytest.raises(launching.LaunchError, match="exited with code 4"):
        launcher.start(on_wait=lambda _state: None)
    assert time.monotonic() - started < 30


def test_preparing_the_builtin_checkpoint_is_a_wait_with_a_status(monkeypatch, tmp_path):
    from reference_engine import builtin_models

    heard = Heard()
    monkeypatch.setattr(builtin_models, "builtin_checkpoint", lambda name: tmp_path / name)
    name = next(iter(builtin_models.BUILTIN_MODELS))
    assert model._resolve_model(name, heard.watcher()) == str(tmp_path / name)
    assert [title for title, _ in heard.waits] == [
        f"built-in model {name}: preparing the checkpoint (converted once, then cached)"
    ]
    assert heard.said and heard.said[-1].startswith(f"built-in model {name}: checkpoint ready in ")
    assert model._resolve_model("/some/dir", heard.watcher()) == "/some/dir" and len(heard.waits) == 1


def test_a_server_start_is_a_wait_that_hears_the_launchers_states():
    heard = Heard()

    class Launcher:
        served_as = None
        log_path = "server.log"
        ready_at = None  # no cold first token to time
        report = SimpleNamespace(repeat=None)

        def start(self, on_wait):
            on_wait("weights done; not listening yet")
            return SimpleNamespace(ready_s=2.5, cold_first_token_s=0.01)

    plan = SimpleNamespace(launch="process", request_timeout=10)
    backend = SimpleNamespace(name="reference", key="reference")
    launch_ = Launch(plan, None, backend, 0, heard.watcher(), None)
    launch_._start(Launcher(), None, None)
    assert heard.waits == [("reference: starting the server", ["weights done; not listening yet"])]
    assert any("ready in 2.5 s" in s for s in heard.said)


@pytest.mark.parametrize("warm_n", [0, 1, 4])
def test_the_warm_up_is_named_in_the_progress_until_measured_requests_finish(tmp_path, warm_n):
    """The progress phase reads "warm-up k/n" while warm-up requests run and nothing measured has finished,
    then "" (measuring); a point without warm-up never names one."""
    heard = Heard()
    made = requests_for("b", "", "wl", "c=1", warm_n + 3, 0.05, np.random.default_rng(warm_n), concurrency=1)
    warm = [r.model_copy(update={"warmup": True}) for r in made[:warm_n]]
    measured = made[warm_n:]

    def fake_load(job):
        assert len(job.warmup_specs) == warm_n
        for k in range(warm_n + 1):
            job.progress(warm[:k])
        job.progress(warm + measured[:1])
        job.progress(warm + measured)
        Path(job.summary_path).touch()
        return warm + measured

    run = RunDir.create(tmp_path / "run", {"model": "m"}, ["compare", "run"])
    plan = SimpleNamespace(
        warmup_count=lambda s: warm_n,
        num_requests=3,
        repeats=1,
        request_timeout=10,
        duration=None,
        busy_poll=False,
        prompt_pool=None,
    )
    schedule = SimpleNamespace(label="c=1", describe=lambda: {"kind": "closed", "concurrency": 1})
    backend = SimpleNamespace(name="b", variant="", key="b")
    workload = SimpleNamespace(label="wl", sessions=False)
    point = Point(plan, backend, None, "http://x", workload, schedule)
    point.run(run, [], [object()] * warm_n, fake_load, None, heard.watcher())
    expected = [f"warm-up {k}/{warm_n}" for k in range(warm_n)] + ["", "", ""]
    assert heard.phases == expected[-len(heard.phases) :] and len(heard.phases) == warm_n + 3


def test_a_run_against_a_refused_endpoint_says_so_with_every_wait_shown(monkeypatch, llama_dir, tmp_path):
    """The whole command: each longer wait is shown (run directory, tokenizer, reports), the refused endpoint
    is named with its URL, and the run exits 1 after the few health checks of `REFUSED_GRACE_S`, not the
    checks of a 10 s health timeout."""
    heard = Heard()
    monkeypatch.setattr(cli, "_console_watcher", heard.watcher)
    url = f"http://127.0.0.1:{launching.free_port()}"
    checks = []
    real = launching.check_health
    monkeypatch.setattr(launching, "check_health", lambda *a, **k: checks.append(a) or real(*a, **k))
    args = ["run", "--backends", "vllm", "--endpoint", f"vllm={url}", "--model", "scripted-model"]
    args += ["--tokenizer", str(llama_dir), "--n-boot", "10", "--out", str(tmp_path / "run")]
    result = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert result.exit_code == 1, result.output
    titles = [title for title, _ in heard.waits]
    assert titles[0].startswith("creating the run directory")
    assert titles[1] == f"loading the tokenizer ({llama_dir})"
    assert titles[-1] == "analysing the run and writing its reports"
    refusals = [s for s in heard.said if "connection refused" in s]
    assert len(refusals) == 1 and f"{url}/health" in refusals[0]
    assert len(checks) <= 1 + launching.REFUSED_GRACE_S / 0.1 + 1


def test_progress_and_spinner_lines_wrap_rather_than_cut_at_80_columns(monkeypatch):
    """A point's title with its warm-up phase, and a wait's title with its state, are shown whole (wrapped
    at their spaces) on an 80-column terminal."""
    shown = Console(width=80, record=True, file=io.StringIO(), force_terminal=True)
    monkeypatch.setattr(cli, "console", shown)
    watcher = cli._console_watcher()
    title = "vllm:tp2-fp8 sharegpt-ShareGPT_V3_unfiltered r=12.5 (launch 2)"
    with watcher.point(title, 40) as show:
        show(0, float("nan"), 0, "warm-up 3/8")
    state = "kv_cache done; health check: no answer within 1 s (the server is busy compiling)"
    with watcher.wait("trtllm-triton:fp8: starting the server") as status:
        status(state)
    text = shown.export_text()
    assert "…" not in text
    words = set(text.split())  # every word whole: wrapped between words, never cut or folded inside one
    for line in (f"{title} (warm-up 3/8)", f"trtllm-triton:fp8: starting the server: {state}"):
        assert set(line.split()) <= words, set(line.split()) - words


def test_a_backend_that_cannot_be_reached_is_said_once_by_name_with_its_log_verbatim(monkeypatch):
    """The error names the backend once (not "vllm could not be reached: vllm: ..."), and a log's own
    brackets ("[core.py:12]", even a stray "[/]") are printed as written, not read as markup."""
    heard = Heard()
    problem = "log: INFO [core.py:12] boom [/] [bold]"

    def refused(*_args, **_kwargs):
        raise launching.LaunchError(f"vllm: {problem}")

    monkeypatch.setattr(launching, "endpoint_report", refused)
    plan = SimpleNamespace(served_model=None, model="m")
    backend = SimpleNamespace(name="vllm", variant="", key="vllm", launched=False, endpoint="http://x")
    run_dir = SimpleNamespace(manifest={"notes": []})
    assert Launch(plan, run_dir, backend, 0, heard.watcher(), None).run("m", None, None, None, None) is False
    shown = Console(width=200, record=True, file=io.StringIO())
    shown.print(heard.said[-1])
    assert shown.export_text().strip() == f"vllm could not be reached: {problem}"
    assert run_dir.manifest["notes"] == [f"vllm: {problem}"]
