"""What each backend declares of itself, collected while measuring into its `SetupReport` for the parity
audit, so that the manifest holds it and `compare report` needs nothing else: the server's `GET /v1/models`
answer, its `/metrics` info gauges' settings and the identity of its tokenizer (the start-up log's settings
are read with its phases, `compare/launch/setup_log.py`). The flags of a launch command are read here too,
for the serving match and the audit. Read back into one `Declared` per backend by
`compare/analysis/declared_settings.py`.

The tokenizer is identified by a hash of its files where the directory is on this machine, else by its name.
"""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from adapters.base import Adapter
from compare.common.datatypes import SetupReport

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


def fetch_metrics_settings(url: str, backend: str, timeout: float = 5.0) -> dict[str, str]:
    """The settings in the labels of the server's `/metrics` info gauges (its adapter's `info_metrics`);
    {} where it has none or does not answer."""
    from adapters import ADAPTERS
    from adapters.prometheus import info_settings

    cls = ADAPTERS.get(backend)
    info = cls.info_metrics if cls is not None else None
    if cls is None or not info:
        return {}
    try:
        with urllib.request.urlopen(url.rstrip("/") + cls.metrics_path, timeout=timeout) as resp:
            text = resp.read().decode("utf-8", "replace")
        return info_settings(text, info)
    except (urllib.error.URLError, OSError, ValueError):
        return {}


def fetch_props_settings(url: str, backend: str, timeout: float = 5.0) -> dict[str, str]:
    """The settings a server states in its settings route (its adapter's `props_path` and `read_props`:
    llama.cpp's `/props`); {} where it has none or does not answer."""
    from adapters import ADAPTERS

    cls = ADAPTERS.get(backend)
    if cls is None or not cls.props_path:
        return {}
    try:
        with urllib.request.urlopen(url.rstrip("/") + cls.props_path, timeout=timeout) as resp:
            return cls.read_props(json.loads(resp.read()))
    except (urllib.error.URLError, OSError, ValueError, AttributeError):
        return {}


def collect(setup: SetupReport, model_path: str | None) -> None:
    """While measuring, once the backend answers: its models route, its `/metrics` info gauges' settings
    and its tokenizer's identity into `setup` (the start-up log's settings are read with its phases,
    `compare.launch.setup_log`)."""
    setup.models_route = fetch_models_route(setup.url)
    setup.metrics_settings = fetch_metrics_settings(setup.url, setup.backend)
    setup.props_settings = fetch_props_settings(setup.url, setup.backend)
    setup.tokenizer_id = tokenizer_identity(_tokenizer_path(setup, model_path))


def _tokenizer_path(setup: SetupReport, model_path: str | None) -> str | None:
    """The tokenizer a server loads: a `--tokenizer` we passed, the one its log names, the model we launched
    it on, or the model directory its model card names (a running endpoint)."""
    flags = command_flags(setup.command)
    if flags.get("--tokenizer"):
        return flags["--tokenizer"]
    if setup.log_settings.get("tokenizer"):
        return setup.log_settings["tokenizer"]
    if setup.launcher != "endpoint":
        return model_path
    root = model_card(setup).get("root")
    return root if isinstance(root, str) and Path(root).is_dir() else None


def setting_flags(cls: type[Adapter] | None, command: list[str]) -> dict[str, str]:
    """The audited settings the launch command sets, by the adapter's `setting_flags` (common name ->
    the flag and its aliases; None: an adapter unknown here sets none); the last one given wins, as in an
    argument parser."""
    given = command_flags(command)
    out = {}
    for name, names in (cls.setting_flags if cls is not None else {}).items():
        for flag in names:
            if flag in given:
                out[name] = given[flag]
    return out


def model_card(setup: SetupReport) -> dict[str, Any]:
    """The first model card of the models route (a server here serves one model)."""
    data = (setup.models_route or {}).get("data")
    return data[0] if isinstance(data, list) and data and isinstance(data[0], dict) else {}


def command_flags(command: list[str]) -> dict[str, str]:
    """`--name value` and bare `--name` flags of a command line (a bare flag maps to ""), and short ones
    (`-tp 2`)."""
    out: dict[str, str] = {}
    for i, word in enumerate(command):
        if not word.startswith("-") or len(word) < 2 or word[1].isdigit():
            continue
        name, eq, value = word.partition("=")
        if not eq:
            following = command[i + 1] if i + 1 < len(command) else "--"
            value = "" if following.startswith("--") else following
        out[name] = value
    return out
