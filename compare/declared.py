"""What each backend declares of itself, for the parity audit (`compare.parity`): collected while measuring
into its `SetupReport` (so the manifest holds it and `compare report` needs nothing else), and read back
into one `parity.Declared` per backend.

Sources, most authoritative first: the server's `GET /v1/models` answer (served name, `max_model_len` in
vLLM's and our engine's model cards), its start-up log (vLLM's engine configuration line; our engine's
weights line for the dtype and its graph-capture line), the command we launched it with (vLLM's flag names,
which our engine shares), and the adapter's documented defaults. The tokenizer is identified by a hash of
its files where the directory is on this machine, else by its name. Whether the forced output length was
honoured is read from the records.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pandas as pd

from compare.datatypes import SetupReport, key_of
from compare.parity import Declared

#: the files that make a Hugging Face tokenizer what it is (those present are hashed, by name and content)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
)
_DTYPES = {"half": "float16", "fp16": "float16", "float": "float32", "fp32": "float32", "bf16": "bfloat16"}


def fetch_models_route(url: str, timeout: float = 5.0) -> dict[str, Any] | None:
    """The server's `GET /v1/models` answer, or None where it has none (a TGI router, a Triton server)."""
    try:
        with urllib.request.urlopen(url.rstrip("/") + "/v1/models", timeout=timeout) as resp:
            answer = json.loads(resp.read())
    except (urllib.error.URLError, OSError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def tokenizer_identity(path: str | None) -> str | None:
    """`sha256:<hex>` over the tokenizer files of a local directory, else `name:<path or hub id>`."""
    if not path:
        return None
    folder = Path(path)
    files = [folder / name for name in TOKENIZER_FILES if (folder / name).is_file()]
    if not files:
        return f"name:{path}"
    digest = hashlib.sha256()
    for file in files:
        digest.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return f"sha256:{digest.hexdigest()}"


def collect(setup: SetupReport, model_path: str | None) -> None:
    """While measuring, once the backend answers: its models route and its tokenizer's identity into
    `setup` (the start-up log's settings are read with its phases, `compare.setup_log`)."""
    setup.models_route = fetch_models_route(setup.url)
    setup.tokenizer_id = tokenizer_identity(_tokenizer_path(setup, model_path))


def _tokenizer_path(setup: SetupReport, model_path: str | None) -> str | None:
    """The tokenizer a server loads: a `--tokenizer` we passed, the one its log names, the model we launched
    it on, or the model directory its model card names (a running endpoint)."""
    flags = _flags(setup.command)
    if flags.get("--tokenizer"):
        return flags["--tokenizer"]
    if setup.log_settings.get("tokenizer"):
        return setup.log_settings["tokenizer"]
    if setup.launcher != "endpoint":
        return model_path
    root = _card(setup).get("root")
    return root if isinstance(root, str) and Path(root).is_dir() else None


def forced_lengths(requests: pd.DataFrame) -> dict[str, bool | None]:
    """Per backend key: whether every ok request that forced its output length got all of it (None: none
    forced it)."""
    out: dict[str, bool | None] = {}
    if requests.empty:
        return out
    ok = requests[(requests["status"] == "ok") & requests["output_length_forced"].astype(bool)]
    for (backend, variant), group in ok.groupby(["backend", "variant"], sort=False):
        out[key_of(backend, variant)] = bool((group["output_tokens"] >= group["wanted_output_tokens"]).all())
    return out


def declared_settings(setup: SetupReport, forced_length: bool | None = None) -> Declared:
    """One backend's declared settings from what its set-up report holds (see the module docstring)."""
    from adapters import ADAPTERS

    cls = ADAPTERS.get(setup.backend)
    defaults = dict(getattr(cls, "declared_defaults", {}) or {})
    vllm_flags = getattr(cls, "server_family", None) in ("vllm", "reference")
    flags = _flags(setup.command) if vllm_flags else {}
    log, card = setup.log_settings, _card(setup)
    found = {
        "served_model": _first(("models route", card.get("id"))),
        "max_model_len": _first(
            ("models route", _int(card.get("max_model_len"))),
            ("log", _int(log.get("max_model_len"))),
            ("command", _int(flags.get("--max-model-len"))),
        ),
        "dtype": _first(
            ("log", _dtype(log.get("dtype") or setup.dtype)), ("command", _dtype(flags.get("--dtype")))
        ),
        "quantization": _first(
            ("log", _lower(log.get("quantization"))),
            ("command", _lower(flags.get("--quantization"))),
            ("default", defaults.get("quantization")),
        ),
        "prefix_caching": _first(
            ("log", _bool(log.get("prefix_caching"))),
            ("command", _flag_bool(flags, "--enable-prefix-caching", "--no-enable-prefix-caching")),
            ("default", defaults.get("prefix_caching")),
        ),
        "cuda_graphs": _graphs(setup, log, flags),
        "tokenizer": _first(("launch", setup.tokenizer_id)),
        "forced_length": _first(("records", forced_length)),
    }
    values = {name: value for name, (value, _) in found.items()}
    sources = {name: source for name, (value, source) in found.items() if value is not None}
    return Declared(**values, sources=sources)


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


def _card(setup: SetupReport) -> dict[str, Any]:
    """The first model card of the models route (a server here serves one model)."""
    data = (setup.models_route or {}).get("data")
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}


def _flags(command: list[str]) -> dict[str, str]:
    """`--name value` and bare `--name` flags of a command line (a bare flag maps to "")."""
    out: dict[str, str] = {}
    for i, word in enumerate(command):
        if not word.startswith("--"):
            continue
        name, eq, value = word.partition("=")
        if not eq:
            following = command[i + 1] if i + 1 < len(command) else "--"
            value = "" if following.startswith("--") else following
        out[name] = value
    return out


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


def _lower(value: str | None) -> str | None:
    return str(value).lower() if value else None


def _dtype(value: str | None) -> str | None:
    """A dtype as torch names it (`float16`, not `half`); `auto` says nothing."""
    if not value or value == "auto":
        return None
    name = value.removeprefix("torch.").lower()
    return _DTYPES.get(name, name)
