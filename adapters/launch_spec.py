"""How to start a backend's server, from one backend-neutral description of the model and the variant.

`ModelSource` says what to serve (a checkpoint directory or a hub id, the name clients use, dtype, context);
`Variant` says what changes between candidates of one backend: CUDA graphs on or off, which batch sizes get a
graph, the KV-cache block size, the most sequences in a batch. Each adapter's `launch_spec` maps them onto
its server's real flags and returns a `LaunchSpec`: the local command, and the container (image, arguments,
port, GPU request, shared memory, model volume, environment). A variant a backend cannot express is refused
with `LaunchSpecError` rather than silently ignored.

Variant syntax (the part after `backend:` in `--backends`): `+`-joined items, `eager` (graphs off), `graphs`
(graphs on), `graphs=1/2/4/8` (graphs on, for these batch sizes), `block=32`, `batch=64`; for example
`vllm:graphs=1/2/4+block=32`. A YAML run file may give the same as keys (`graphs`, `graph_sizes`,
`block_size`, `max_batch_size`), and the variant is then only a name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

#: where a launch's own folder (configuration files) appears inside a container
CONFIG_MOUNT = "/llm-compare"
#: where the model's checkpoint directory appears inside a container
MODEL_MOUNT = "/models"


class LaunchSpecError(ValueError):
    """The backend cannot be launched as asked (a variant it cannot express, no server to start, ...)."""


@dataclass(frozen=True)
class ModelSource:
    """What to serve, whatever the backend: `model` is a checkpoint directory on this host or a hub id."""

    model: str
    served_name: str
    dtype: str = "auto"
    max_model_len: int | None = None

    @property
    def local(self) -> bool:
        return Path(self.model).is_dir()

    def in_container(self) -> str:
        """The model as a server in a container names it: the mounted directory, or the hub id."""
        return MODEL_MOUNT if self.local else self.model

    def volumes(self) -> dict[str, dict[str, str]]:
        """The checkpoint directory, read-only, where `in_container` says."""
        if not self.local:
            return {}
        return {str(Path(self.model).resolve()): {"bind": MODEL_MOUNT, "mode": "ro"}}


_ITEM = re.compile(r"^(?P<key>[a-z_]+)(?:=(?P<value>[0-9/]+))?$")


@dataclass(frozen=True)
class Variant:
    """A backend's configuration under test. None everywhere means the backend's own defaults."""

    name: str = ""
    graphs: bool | None = None
    graph_sizes: tuple[int, ...] | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None

    @classmethod
    def parse(cls, text: str, **given: Any) -> Variant:
        """From the variant syntax (module docstring), or, where a run file gave keys (`given`), from those,
        the text being only the variant's name."""
        out = cls(text)
        keys = ("graphs", "graph_sizes", "block_size", "max_batch_size")
        keyed = any(given.get(k) is not None for k in keys)
        items = [] if keyed else [t.strip() for t in text.split("+") if t.strip()]
        if "eager" in items and any(t.startswith("graphs") for t in items):
            raise LaunchSpecError(f"variant {text!r} turns CUDA graphs off and on")
        for item in items:
            match = _ITEM.match(item)
            key, value = (match["key"], match["value"]) if match else (item, None)
            if key == "eager" and value is None:
                out = replace(out, graphs=False)
            elif key == "graphs":
                out = replace(out, graphs=True, graph_sizes=_sizes(value, text) if value else out.graph_sizes)
            elif key == "block" and value:
                out = replace(out, block_size=_positive(value, text))
            elif key == "batch" and value:
                out = replace(out, max_num_seqs=_positive(value, text))
            else:
                raise LaunchSpecError(
                    f"unknown variant item {item!r} in {text!r}: use eager, graphs, graphs=1/2/4, block=N, "
                    "batch=N, joined with +"
                )
        if given.get("graphs") is not None:
            out = replace(out, graphs=bool(given["graphs"]))
        if given.get("graph_sizes"):
            sizes = given["graph_sizes"]
            sizes = "/".join(str(s) for s in sizes) if isinstance(sizes, list | tuple) else str(sizes)
            out = replace(out, graphs=True, graph_sizes=_sizes(sizes.replace(",", "/"), text))
        if given.get("block_size"):
            out = replace(out, block_size=_positive(str(given["block_size"]), text))
        if given.get("max_batch_size"):
            out = replace(out, max_num_seqs=_positive(str(given["max_batch_size"]), text))
        if out.graphs is False and out.graph_sizes:
            raise LaunchSpecError(f"variant {text!r} turns CUDA graphs off and names graph sizes")
        return out


def _positive(value: str, text: str) -> int:
    number = int(value)
    if number < 1:
        raise LaunchSpecError(f"variant {text!r}: {value} must be a positive integer")
    return number


def _sizes(value: str, text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(sorted({_positive(v, text) for v in value.split("/") if v}))
    except ValueError:
        raise LaunchSpecError(f"variant {text!r}: graph sizes are positive integers joined by /") from None
    if not sizes:
        raise LaunchSpecError(f"variant {text!r}: give at least one graph batch size")
    return sizes


@dataclass
class LaunchSpec:
    """One backend in one variant, ready to start as a local process (`command`, host paths, listening on
    127.0.0.1:`port`) or as a container (`image` with `container_args`, listening on `container_port`)."""

    backend: str
    command: list[str]
    image: str
    container_args: list[str]
    port: int
    health_path: str = "/health"
    container_port: int = 8000
    entrypoint: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)  # for both ways
    process_env: dict[str, str] = field(default_factory=dict)  # only for the local process (host paths)
    gpus: bool = False
    shm_size: str | None = None
    volumes: dict[str, dict[str, str]] = field(default_factory=dict)
    ulimits: dict[str, int] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # written into the launch's folder before the start
    dirs: list[str] = field(default_factory=list)  # host directories the process needs, made before the start
    scratch: list[str] = field(default_factory=list)  # host directories outside the run, removed at the stop
    container_error: str | None = None  # why the default image cannot run here (e.g. it needs a GPU)
    served_as: str | None = None  # the model name requests must carry, where the server picks it itself
    container_served_as: str | None = None
    notes: list[str] = field(default_factory=list)

    def with_extra_args(self, extra: list[str] | tuple[str, ...]) -> LaunchSpec:
        """`--server-args`: the same flags for the process and the container."""
        return replace(self, command=[*self.command, *extra], container_args=[*self.container_args, *extra])


def needs_gpu(backend: str) -> str:
    return (
        f"{backend}'s official image needs an NVIDIA GPU and none is visible here: launch it as a process, "
        f"or name an image that runs here with --image {backend}=IMAGE"
    )
