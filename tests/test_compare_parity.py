"""The parity audit: what each backend declares (models route, start-up log, command, defaults, records),
the table and warnings in the report, and the decision's note when its result rests on an unequal
setting. Run directories are built by hand, so the report is rebuilt from the directory alone."""

from __future__ import annotations

import shutil
from pathlib import Path

from test_compare_report import make_run

from compare.analysis.declared_settings import declared_settings
from compare.analysis.parity import Declared, findings, parity_table
from compare.analysis.results import analyze
from compare.common.datatypes import SetupReport
from compare.launch.declared import collect, tokenizer_identity
from compare.launch.launcher import endpoint_report
from compare.launch.setup_log import parse_log
from compare.measure.run_dir import RunDir
from compare.report.write import write_reports
from instruments.scripted_server import scripted_server

DATA = Path(__file__).parent / "data"


def models(max_model_len: int | None, name: str = "m") -> dict:
    card = {"id": name, "object": "model"}
    if max_model_len is not None:
        card["max_model_len"] = max_model_len
    return {"object": "list", "data": [card]}


def vllm_setup(max_model_len: int | None) -> SetupReport:
    """vLLM's CPU build as recorded (tests/data/vllm_cpu_serve.log: float32, max_seq_len=1024, eager,
    prefix caching on), its models route answering `max_model_len`."""
    setup = SetupReport("vllm", "", "process", "http://a", command=["vllm", "serve", "/m"], device="cpu")
    setup.log_settings = parse_log("vllm", (DATA / "vllm_cpu_serve.log").read_text()).settings
    setup.models_route = models(max_model_len)
    return setup


def reference_setup(max_model_len: int | None, *flags: str) -> SetupReport:
    command = ["python", "-m", "reference_engine.server", "--model", "/m", *flags]
    setup = SetupReport("reference", "", "process", "http://b", command=command, device="cpu")
    setup.dtype = "float32"  # as its weights line logs it
    setup.models_route = models(max_model_len)
    return setup


def report_of(path: Path, setups: dict[str, SetupReport]) -> str:
    make_run(path, {"vllm": 0.01, "reference": 0.02}, setups)
    write_reports(analyze(RunDir.open(path), n_boot=100))  # as `compare report RUN_DIR` does
    return (path / "report.md").read_text()


def section(report: str, title: str) -> str:
    return report.split(f"## {title}", 1)[1].split("\n## ", 1)[0]


def test_unequal_context_and_prefix_caching_are_flagged(tmp_path):
    setups = {
        "vllm": vllm_setup(4096),
        "reference": reference_setup(2048, "--no-enable-prefix-caching"),
    }
    report = report_of(tmp_path / "run", setups)
    parity = section(report, "Parity of the backends")
    assert "| setting | vllm | reference |" in parity  # a row per setting, a column per backend
    assert "| max model length | ⚠ **4096** (models route) | ⚠ **2048** (models route) |" in parity
    assert "| quantisation | none (log) | none (default) |" in parity
    assert "| prefix caching | ⚠ **on** (log) | ⚠ **off** (command) |" in parity
    assert "Unequal max model length: vllm 4096, reference 2048." in parity
    assert "Unequal prefix caching: vllm on, reference off." in parity
    # equal settings are not flagged: both eager on a CPU, both float32, both honoured the forced length
    assert "Unequal CUDA graphs" not in report and "Unequal dtype" not in report
    assert parity.count("honoured (records)") == 2
    warnings = section(report, "Warnings")
    assert "Unequal max model length: vllm 4096, reference 2048. Results between these backends rest on" in (
        warnings
    )
    decision = section(report, "Decision")
    assert (  # the verdict names what qualifies it (confidence.Qualifier, from the parity findings)
        "Qualified by unequal settings (max model length: vllm 4096, reference 2048; prefix caching: vllm "
        "on, reference off)." in decision
    )


def test_equal_settings_give_no_warning(tmp_path):
    setups = {"vllm": vllm_setup(2048), "reference": reference_setup(2048)}
    report = report_of(tmp_path / "run", setups)
    parity = section(report, "Parity of the backends")
    assert "No difference among the settings the backends declare." in parity
    assert "⚠ **" not in report and "Unequal" not in report and "unequal settings" not in report
    # the reference engine's prefix caching is its documented default
    assert "| prefix caching | on (log) | on (default) |" in parity


def test_unknown_is_shown_as_unknown_never_as_a_difference(tmp_path):
    endpoint = SetupReport("vllm", "", "endpoint", "http://a")  # no models route, no log, no command
    report = report_of(tmp_path / "run", {"vllm": endpoint, "reference": reference_setup(None)})
    parity = section(report, "Parity of the backends")
    column = [line.split(" | ")[1] for line in parity.splitlines() if line.startswith("| ") and " | " in line]
    known = [c for c in column[1:] if not c.startswith("unknown")]  # past the header
    assert known == ["honoured (records)"]  # all but the records' forced-length check
    # what flags, a log or defaults would have said: the endpoint's are not known
    assert column.count("unknown (endpoint: flags not known)") == 14
    assert "⚠ **" not in report and "Unequal" not in report
    declared = {"a": Declared(tokenizer="sha256:" + "1" * 64), "b": Declared(tokenizer="name:org/model")}
    assert findings(declared) == []  # a hash and a name cannot be told apart
    [finding] = findings({**declared, "c": Declared(tokenizer="sha256:" + "2" * 64)})
    assert finding.setting.name == "tokenizer" and set(finding.values) == {"a", "b", "c"}
    header, rows = parity_table({"a": Declared()})
    assert header == ["setting", "a"] and all(row[1] == "unknown" for row in rows) and len(rows) == 18


def test_vllm_log_and_flags_are_read(tmp_path):
    declared = declared_settings(vllm_setup(None), forced_length=False)
    assert (declared.max_model_len, declared.dtype, declared.quantization) == (1024, "float32", "none")
    assert declared.prefix_caching is True and declared.cuda_graphs is False
    assert declared.forced_length is False
    assert declared.sources["max_model_len"] == "log"
    flags = ("--max-model-len", "512", "--dtype", "half", "--enforce-eager", "--enable-prefix-caching")
    setup = reference_setup(None, *flags)
    setup.device, setup.dtype = "cuda:0", None
    declared = declared_settings(setup)
    assert (declared.max_model_len, declared.dtype, declared.cuda_graphs, declared.prefix_caching) == (
        512,
        "float16",
        False,
        True,
    )
    assert declared.sources["prefix_caching"] == "command"


def test_tokenizer_identity_hashes_the_files(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    (a / "tokenizer.json").write_text('{"model": {"vocab": {"x": 1}}}')
    (a / "tokenizer_config.json").write_text("{}")
    (a / "model.safetensors").write_text("weights are not the tokenizer")
    shutil.copytree(a, b)
    (b / "model.safetensors").write_text("other weights")
    assert tokenizer_identity(str(a)) == tokenizer_identity(str(b)) and tokenizer_identity(str(a)).startswith(
        "sha256:"
    )
    (b / "tokenizer.json").write_text('{"model": {"vocab": {"y": 1}}}')
    assert tokenizer_identity(str(a)) != tokenizer_identity(str(b))
    assert tokenizer_identity("org/model") == "name:org/model" and tokenizer_identity(None) is None


def test_running_endpoints_declare_their_context_through_the_models_route(tmp_path):
    """Two scripted servers (vLLM's protocol) declaring different `max_model_len`: collected as `compare run`
    collects a running endpoint, written to the manifest, and flagged in the report rebuilt from it."""
    run = make_run(tmp_path / "run", {"vllm": 0.01, "reference": 0.02})
    with scripted_server(max_model_len=2048) as a, scripted_server(max_model_len=8192) as b:
        for name, server in (("vllm", a), ("reference", b)):
            setup = endpoint_report(name, "", server.url, "/health")
            collect(setup, None)
            run.set_setup(setup)
    write_reports(analyze(RunDir.open(run.path), n_boot=100))
    report = (run.path / "report.md").read_text()
    assert "Unequal max model length: vllm 2048, reference 8192." in section(report, "Parity of the backends")
    assert "| served model | scripted-model (models route) | scripted-model (models route) |" in report
    assert "| max model length | ⚠ **2048** (models route) | ⚠ **8192** (models route) |" in report
