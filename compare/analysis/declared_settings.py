"""What each backend declares of itself, read back for the parity audit (`compare.analysis.parity`): one
`Declared` per backend from its `SetupReport` (collected while measuring, `compare/launch/declared.py`), its
start-up log read again and the records.

Sources, most authoritative first: the server's `GET /v1/models` answer (served name, `max_model_len` in
vLLM's and our engine's model cards, a dtype or quantisation where a card gives them), its start-up log
(vLLM's engine configuration line and its `non-default args` line; our engine's configuration line, its
weights line for the dtype, its graph-capture line and its front-end line), the labels of its `/metrics`
info gauges (vLLM's `cache_config_info`: block size, KV-cache dtype, prefix caching, GPU memory fraction),
a settings route where its adapter names one (llama.cpp's `/props`: file type, slots, context per slot),
the command we launched it with (each adapter's `setting_flags`), and the adapter's documented defaults
(for a server we launched only: a running endpoint's flags are not known). The tokenizer is identified by
a hash of its files where the directory is on this machine, else by its name. Whether the forced output
length was honoured is read from the records. A value that none of these gives is unknown, and the audit
says why where it can.

`compare report` reads the start-up log again where the run directory holds it, so that a run recorded
before a setting was read gets it too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from adapters.base import Adapter
from compare.analysis.parity import Declared
from compare.common.datatypes import SetupReport, key_of
from compare.launch.declared import command_flags, model_card, setting_flags
from compare.launch.setup_log import parse_log

_DTYPES = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32", "bf16": "bfloat16"}


def reread_log(setup: SetupReport, run_path: Path | None) -> dict[str, str]:
    """The configuration lines of the launch's start-up log read again with today's patterns, where the
    run directory (or the path recorded) still holds the log; else the settings the manifest recorded."""
    candidates = []
    if setup.log_path:  # the run directory's own copy first: the recorded path may now hold another run's
        recorded = Path(setup.log_path)
        if run_path is not None:
            candidates += [run_path / "logs" / recorded.name, run_path / recorded.name]
        candidates.append(recorded)
    for path in candidates:
        if path.is_file():
            settings = parse_log(setup.backend, path.read_text(encoding="utf-8", errors="replace")).settings
            return {**setup.log_settings, **settings}
    return dict(setup.log_settings)


def forced_lengths(requests: pd.DataFrame) -> dict[str, bool | None]:
    """Per backend key: whether every ok request that forced its output length got all of it (None: none
    forced it)."""
    out: dict[str, bool | None] = {}
    if requests.empty:
        return out
    ok = requests[(requests["status"] == "ok") & requests["output_length_forced"].astype(bool)]
    for (backend, variant), group in ok.groupby(["backend", "variant"], sort=False):
        forced = group["output_tokens"] >= group["wanted_output_tokens"]
        out[key_of(str(backend), str(variant))] = bool(forced.all())
    return out


def declared_settings(
    setup: SetupReport, forced_length: bool | None = None, run_path: Path | None = None
) -> Declared:
    """One backend's declared settings from what its set-up report holds (see the module docstring);
    `run_path`: the run directory, where its start-up log may be read again."""
    from adapters import ADAPTERS

    cls = ADAPTERS.get(setup.backend, Adapter)  # an imported result's backend has no adapter
    launched = setup.launcher != "endpoint"
    defaults = dict(cls.declared_defaults) if launched else {}
    flags = command_flags(setup.command) if cls.vllm_style_flags else {}
    named = setting_flags(cls, setup.command)
    log, card, info = reread_log(setup, run_path), model_card(setup), setup.metrics_settings or {}
    props = setup.props_settings or {}
    found = {
        "served_model": _first(("models route", card.get("id"))),
        "max_model_len": _first(
            ("models route", _int(card.get("max_model_len"))),
            ("log", _int(log.get("max_model_len"))),
            ("props", _int(props.get("max_model_len"))),
            ("command", _int(flags.get("--max-model-len"))),
        ),
        "dtype": _first(
            ("models route", _dtype(card.get("dtype"))),
            ("log", _dtype(log.get("dtype") or setup.dtype)),
            ("props", _dtype(props.get("dtype"))),
            ("command", _dtype(flags.get("--dtype"))),
        ),
        "quantization": _first(
            ("models route", _lower(card.get("quantization"))),
            ("log", _lower(log.get("quantization"))),
            ("props", _lower(props.get("quantization"))),
            ("command", _lower(flags.get("--quantization") or flags.get("-q"))),
            ("default", defaults.get("quantization")),
        ),
        "prefix_caching": _first(
            ("log", _bool(log.get("prefix_caching"))),
            ("metrics", _bool(info.get("prefix_caching"))),
            ("command", _flag_bool(flags, "--enable-prefix-caching", "--no-enable-prefix-caching")),
            ("default", defaults.get("prefix_caching")),
        ),
        "cuda_graphs": _graphs(setup, log, flags),
        "tokenizer": _first(("launch", setup.tokenizer_id)),
        "forced_length": _first(("records", forced_length)),
        "api_servers": _first(
            ("log", _int(log.get("api_servers"))),
            ("command", _int(named.get("api_servers"))),
            *_default_api_servers(setup, cls, log, named),
        ),
        "max_num_seqs": _first(
            ("log", _int(log.get("max_num_seqs"))),
            ("props", _int(props.get("max_num_seqs"))),
            ("command", _int(named.get("max_num_seqs"))),
        ),
        "max_batched_tokens": _first(
            ("log", _int(log.get("max_batched_tokens"))), ("command", _int(named.get("max_batched_tokens")))
        ),
        "chunked_prefill": _first(
            ("log", _bool(log.get("chunked_prefill"))),
            ("command", _flag_bool(flags, "--enable-chunked-prefill", "--no-enable-chunked-prefill")),
            ("default", defaults.get("chunked_prefill")),
        ),
        "speculative": _first(
            ("log", _speculative(log.get("speculative"))),
            ("command", _speculative(named.get("speculative"))),
            ("default", defaults.get("speculative")),
        ),
        "kv_cache_dtype": _first(
            ("log", _lower(log.get("kv_cache_dtype"))),
            ("metrics", _lower(info.get("kv_cache_dtype"))),
            ("command", _lower(named.get("kv_cache_dtype"))),
            ("default", defaults.get("kv_cache_dtype")),
        ),
        **_placement_settings(setup, cls, log, named, info, defaults),
    }
    values = {name: value for name, (value, _) in found.items()}
    sources = {name: source for name, (value, source) in found.items() if value is not None}
    unknown = {name: _why_unknown(setup, name, log) for name, value in values.items() if value is None}
    return Declared(**values, sources=sources, unknown={k: v for k, v in unknown.items() if v})


def _placement_settings(
    setup: SetupReport,
    cls: type[Adapter],
    log: dict[str, str],
    named: dict[str, str],
    info: dict[str, str],
    defaults: Any,
) -> dict[str, tuple[Any, str]]:
    """How the model is laid over the devices and their memory: parallelism, memory fraction, KV block
    size, each from the first source that states it (as `declared_settings`)."""
    return {
        "tensor_parallel": _first(
            ("log", _int(log.get("tensor_parallel"))),
            ("command", _int(named.get("tensor_parallel"))),
            ("default", defaults.get("tensor_parallel")),
        ),
        "pipeline_parallel": _first(
            ("log", _int(log.get("pipeline_parallel"))),
            ("command", _int(named.get("pipeline_parallel"))),
            ("default", defaults.get("pipeline_parallel")),
        ),
        "gpu_memory_utilization": _first(
            ("metrics", _float(info.get("gpu_memory_utilization"))),
            ("log", _float(log.get("gpu_memory_utilization"))),
            ("command", _float(named.get("gpu_memory_utilization"))),
            ("default", _gpu_memory_default(setup, cls)),
        ),
        "block_size": _first(
            ("metrics", _int(info.get("block_size"))),
            ("log", _int(log.get("block_size"))),
            ("command", _int(named.get("block_size"))),
        ),
    }


def _default_api_servers(
    setup: SetupReport, cls: type[Adapter], log: dict[str, str], named: dict[str, str]
) -> list[tuple[str, Any]]:
    """The HTTP front ends a launched server has when not told, by its adapter's `api_servers_default`:
    one per data-parallel rank (vLLM: 1 unless --data-parallel-size); or 1 on a CPU, and, on a GPU, 1 where
    its configuration line was read and no front-end line (ours logs one only for several)."""
    if setup.launcher == "endpoint":
        return []
    if cls.api_servers_default == "per_data_parallel_rank":
        return [("default", _int(log.get("data_parallel")) or _int(named.get("data_parallel")) or 1)]
    if cls.api_servers_default == "one_unless_logged":
        on_cpu = bool(setup.device and setup.device.startswith("cpu"))
        return [("default", 1 if on_cpu else None), ("log", 1 if "max_num_seqs" in log else None)]
    return []


def _gpu_memory_default(setup: SetupReport, cls: type[Adapter]) -> float | None:
    """The GPU memory fraction its adapter declares as its server's default (ours: 0.9), on a GPU we
    launched it on (a CPU has none)."""
    on_gpu = bool(setup.device and setup.device.startswith("cuda"))
    return cls.gpu_memory_default if on_gpu and setup.launcher != "endpoint" else None


def _why_unknown(setup: SetupReport, name: str, log: dict[str, str]) -> str:
    """Why a setting is unknown, in a few words (empty where nothing could have said it)."""
    if name in ("served_model", "tokenizer", "forced_length", "cuda_graphs"):
        return ""
    if setup.launcher == "endpoint":
        return "endpoint: flags not known"
    if not log:
        return "no start-up log read, not in its flags"
    return "not in its flags or log; its default varies"


def _graphs(setup: SetupReport, log: dict[str, str], flags: dict[str, str]) -> tuple[Any, str]:
    """CUDA graphs: off where the log says eager, or on a CPU (no graphs there); on where graphs were
    captured; else as the command asked."""
    eager = _bool(log.get("enforce_eager"))
    captured = any(p.name == "cuda_graphs" for p in setup.phases)
    on_cpu = bool(setup.device and setup.device.startswith("cpu"))
    return _first(
        ("log", None if eager is None else not eager),
        ("device", False if on_cpu else None),
        ("log", True if captured else None),
        ("command", False if "--enforce-eager" in flags else None),
    )


def _first(*candidates: tuple[str, Any]) -> tuple[Any, str]:
    """The first known value and where it came from."""
    return next(((value, source) for source, value in candidates if value is not None), (None, ""))


def _int(value: Any) -> int | None:
    try:
        return int(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _bool(value: str | None) -> bool | None:
    return {"true": True, "false": False}.get(str(value).lower()) if value is not None else None


def _flag_bool(flags: dict[str, str], on: str, off: str) -> bool | None:
    return True if on in flags else False if off in flags else None


def _float(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


def _speculative(value: str | None) -> str | None:
    """A speculative-decoding setting as its method; `None` (vLLM's log) is none."""
    if value is None or value == "":
        return None
    if value in ("None", "none", "null"):
        return "none"
    try:
        given = json.loads(value)
    except ValueError:
        return str(value).lower()
    if isinstance(given, dict):
        return str(given.get("method") or ("draft" if given.get("model") else "on"))
    return str(given).lower()


def _lower(value: str | None) -> str | None:
    return str(value).lower() if value else None


def _dtype(value: str | None) -> str | None:
    """A dtype as torch names it (`float16`, not `half`); `auto` says nothing."""
    if not value or value == "auto":
        return None
    name = value.removeprefix("torch.").lower()
    return _DTYPES.get(name, name)
