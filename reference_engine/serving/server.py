"""HTTP server for the reference engine: OpenAI and TGI protocols, health, version, Prometheus metrics.

    python -m reference_engine.server --model smollm2-135m --port 8000

Binds 127.0.0.1 unless told otherwise. Start-up phases are logged as plain lines a launcher can parse
(`weights loaded: ... in 1.234 s`, `KV cache allocated: ... in 0.123 s`, `server ready at ... in 5.678 s`).
SIGTERM or SIGINT stop accepting work, let running requests finish for up to --shutdown-timeout seconds,
abort the rest, and exit 0.

Two processes (the default, `--engine-process`): this one is the front end (HTTP, validation, tokenising and
detokenising, stop strings, SSE framing, metrics); the engine core (`engine_core.py`) runs `Engine.step()` in
a child process started with spawn. The front end sends it batches of add/abort commands over a pipe; it sends
back one message per step with every request's new tokens and the engine's counters (`engine_client.py` reads
them on a thread and hands each to the event loop). Start-up lines come from the child on the shared stderr;
the child also sends the front end what it needs to know about the engine (`EngineInfo`). Each process has its
own GIL, so the core's host work does not wait for per-token serving work. If the core dies or a step raises,
in-flight requests end with an error and /health answers 503. `--no-engine-process` runs the engine in a
thread of this process instead (`async_engine.py`). `--api-server-count N` adds N-1 front-end processes on the
same port, each with its own pipes to the core (`frontends.py`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hmac
import logging
import os
import signal
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from functools import partial
from importlib import metadata
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from transformers import PreTrainedTokenizerBase

from reference_engine.config import cpu_threads
from reference_engine.engine_info import EngineInfo
from reference_engine.heap import freeze_heap, freeze_startup_heap
from reference_engine.serving.core_process import LOG_FORMAT, FrontLink, StartedCore, start_engine_core
from reference_engine.serving.engine_client import connect_engine_core
from reference_engine.serving.generation import GenerationRequest, generate_tokens, new_request_id
from reference_engine.serving.openai_api import (
    ApiError,
    ChatCompletionRequest,
    OpenAIRoutes,
    dumps,
    error_body,
)
from reference_engine.serving.options import engine_config
from reference_engine.serving.request_streams import EngineDeadError, OverloadedError, RequestStreams
from reference_engine.serving.server_metrics import CONTENT_TYPE, ServerMetrics
from reference_engine.serving.tgi_api import TGIRoutes
from reference_engine.tokenizer import checkpoint_tokenizer

if TYPE_CHECKING:  # started by the command line's module, never imported from here (it imports this module)
    from reference_engine.serving.frontends import ExtraFrontends

log = logging.getLogger("reference_engine.server")
STATE_KEY = web.AppKey("state", object)
RETRY_AFTER_SECONDS = 1
_TGI_ERROR_TYPES = {
    400: "validation",
    401: "authentication",
    404: "not_found",
    405: "method_not_allowed",
    413: "validation",
    422: "validation",
    503: "overloaded",
    500: "generation",
}
_OPEN_PATHS = {"/health", "/version", "/metrics", "/ping"}
PARENT_CHECK_S = 0.5  # how often an extra front end checks that the first is still there


def package_version() -> str:
    try:
        return metadata.version("llm-compare")
    except metadata.PackageNotFoundError:
        return "0+unknown"


@dataclass
class ServerState:
    info: EngineInfo
    tokenizer: PreTrainedTokenizerBase
    async_engine: RequestStreams
    served_model_name: str
    model_path: str
    api_key: str | None = None
    created: int = field(default_factory=lambda: int(time.time()))
    version: str = field(default_factory=package_version)

    def __post_init__(self) -> None:
        self.metrics = ServerMetrics(self.served_model_name)
        self.async_engine.on_abort = self.metrics.aborted_one
        self.eos_ids = set(self.info.eos_token_ids)
        self.special_ids = set(getattr(self.tokenizer, "all_special_ids", []))
        self.compute_type = "gpu+optimized" if self.info.device_type == "cuda" else "cpu"
        self.fingerprint = f"reference-{self.version}"

    def submit(self, request_id: str, gen: GenerationRequest) -> None:
        if not self.async_engine.accepting:
            raise ApiError(503, "the server is shutting down")
        try:
            self.async_engine.submit(request_id, gen.prompt_ids, gen.params)
        except OverloadedError as exc:
            raise ApiError(503, f"Model is overloaded: {exc}") from exc
        except EngineDeadError as exc:
            raise ApiError(503, str(exc)) from exc
        except ValueError as exc:
            raise ApiError(400, str(exc)) from exc

    def start(self, prefix: str, gen: GenerationRequest):
        """Submit a request and return its id and its stream of token events."""
        request_id = new_request_id(prefix)
        self.submit(request_id, gen)
        return request_id, generate_tokens(self.async_engine, self.tokenizer, self.metrics, request_id, gen)

    def render_chat(self, req: ChatCompletionRequest) -> list[int]:
        """Apply the checkpoint's chat template; the template supplies special tokens itself."""
        if not getattr(self.tokenizer, "chat_template", None):
            raise ApiError(400, "this model has no chat template; use /v1/completions")
        messages = []
        for m in req.messages:
            content = m.content
            if isinstance(content, list):
                texts = [part.get("text") for part in content if part.get("type") == "text"]
                if len(texts) != len(content) or not all(isinstance(t, str) for t in texts):
                    raise ApiError(400, "only text content parts are supported", "messages")
                content = "".join(texts)
            messages.append({"role": m.role, "content": content or ""})
        try:
            text = self.tokenizer.apply_chat_template(
                messages,
                tokenize=False,
                add_generation_prompt=req.add_generation_prompt and not req.continue_final_message,
                continue_final_message=req.continue_final_message,
                **(req.chat_template_kwargs or {}),
            )
        except Exception as exc:  # jinja raises many kinds; all mean this request's messages don't fit
            raise ApiError(
                400, f"the chat template could not render these messages: {exc}", "messages"
            ) from exc
        return self.tokenizer.encode(text, add_special_tokens=False)


def _is_openai_path(path: str) -> bool:
    return path.startswith("/v1/")


def render_error(request: web.Request, status: int, message: str, param: str | None = None) -> web.Response:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 503 else None
    if _is_openai_path(request.path):
        body: dict[str, Any] = error_body(status, message, param)
    else:
        body = {"error": message, "error_type": _TGI_ERROR_TYPES.get(status, "generation")}
    return web.json_response(body, status=status, headers=headers, dumps=dumps)


@web.middleware
async def errors_and_auth(request: web.Request, handler) -> web.StreamResponse:
    """API-key check, and every failure rendered in the protocol's own error shape."""
    state: ServerState = request.app[STATE_KEY]
    if state.api_key and request.path not in _OPEN_PATHS:
        header = request.headers.get("Authorization", "")
        given = header[7:] if header.startswith("Bearer ") else ""
        if not hmac.compare_digest(given.encode(), state.api_key.encode()):
            return render_error(
                request, 401, "Unauthorized: a valid API key is required (Authorization: Bearer <key>)"
            )
    try:
        return await handler(request)
    except ApiError as exc:
        return render_error(request, exc.status, exc.message, exc.param)
    except web.HTTPRequestEntityTooLarge as exc:
        return render_error(request, 413, f"the request body is too large ({exc.text})")
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return render_error(request, exc.status, exc.reason)
    except (ConnectionResetError, asyncio.CancelledError):
        raise
    except Exception as exc:
        log.exception("unhandled error serving %s", request.path)
        if isinstance(exc, EngineDeadError):
            return render_error(request, 503, str(exc))
        return render_error(request, 500, f"internal error: {type(exc).__name__}: {exc}")


async def health(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    if state.async_engine.error is not None:
        return render_error(request, 503, f"unhealthy: {state.async_engine.error}")
    return web.Response(status=200)


async def version(request: web.Request) -> web.Response:
    return web.json_response({"version": request.app[STATE_KEY].version})


async def metrics(request: web.Request) -> web.Response:
    state: ServerState = request.app[STATE_KEY]
    body = state.metrics.render(state.async_engine, state.info.setup)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def build_app(state: ServerState, max_body_bytes: int = 4 * 1024**2) -> web.Application:
    app = web.Application(client_max_size=max_body_bytes, middlewares=[errors_and_auth])
    app[STATE_KEY] = state
    app.add_routes(
        [
            web.get("/health", health),
            web.get("/ping", health),
            web.get("/version", version),
            web.get("/metrics", metrics),
        ]
    )
    app.add_routes(OpenAIRoutes(state).routes())
    app.add_routes(TGIRoutes(state).routes())

    async def on_startup(_: web.Application) -> None:
        state.async_engine.start()

    async def on_cleanup(_: web.Application) -> None:
        await state.async_engine.close()

    app.on_startup.append(on_startup)
    app.on_cleanup.append(on_cleanup)
    return app


async def serve(
    args: argparse.Namespace,
    started: float,
    core: StartedCore | None = None,
    extra: ExtraFrontends | None = None,
) -> int:
    """The first (or only) front end: start the engine core unless given, serve until SIGTERM or SIGINT, then
    stop the extra front ends (`extra`, started by `python -m reference_engine.server` beside the core),
    drain, and stop the core."""
    config = engine_config(args)
    if (args.api_server_count > 1) != (extra is not None and core is not None):
        raise ValueError(
            "extra front ends are started, with the engine core, by python -m reference_engine.server"
        )
    if args.engine_process:
        if core is None:
            core = start_engine_core(config, args.cpu_threads, args.log_level.upper(), LOG_FORMAT)
        try:
            state = await engine_core_state(args, core.links[0], core.process)
        except BaseException:
            if extra is not None:
                await extra.stop(0.0)
            raise
    else:  # the engine in this process: only then does the front end import torch and the engine
        import torch

        from reference_engine.engine import Engine
        from reference_engine.serving.async_engine import AsyncEngine

        if args.device == "cpu" or (args.device == "auto" and not torch.cuda.is_available()):
            threads = cpu_threads(args.cpu_threads)
            log.info("CPU serving with %d torch threads", threads)
            torch.set_num_threads(threads)
        engine = await asyncio.to_thread(Engine, config)
        tokenizer = timed_tokenizer_load(lambda: engine.tokenizer)
        state = ServerState(
            EngineInfo.of(engine),
            tokenizer,
            AsyncEngine(engine, args.max_waiting),
            args.served_model_name or args.model,
            args.model,
            args.api_key,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watchers = []
    if extra is not None:
        try:
            await extra.wait_listening()
        except RuntimeError:
            await extra.stop(0.0)
            await state.async_engine.close()
            raise
        watchers = extra.watch(stop)
    runner = await listen(state, args, shared_port=extra is not None)
    freeze_startup_heap("front end")  # modules, tokenizer, app: out of the collector's sweeps while serving
    log.info("event loop: %s.%s", type(loop).__module__, type(loop).__name__)
    if extra is not None:
        log.info("%d front-end processes share the port", len(extra) + 1)
    log.info("server ready at http://%s:%d in %.3f s", args.host, args.port, time.perf_counter() - started)
    await stop.wait()
    stopping_others = [asyncio.ensure_future(extra.stop(args.shutdown_timeout))] if extra else []
    await drain(state, args.shutdown_timeout)
    await asyncio.gather(*stopping_others, *watchers)
    await runner.cleanup()
    log.info("server stopped")
    return 0


async def serve_extra(args: argparse.Namespace, index: int, link: FrontLink, status: Connection) -> int:
    """An extra front end (`frontends.py`): serve the port beside the first until told to stop or the first
    has gone."""
    parent = os.getppid()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    state = await engine_core_state(args, link, None, log_phases=False)
    runner = await listen(state, args, shared_port=True)
    freeze_startup_heap(f"front end {index}")
    status.send(("listening",))
    log.debug("front end %d listening", index)
    while not stop.is_set() and os.getppid() == parent:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), PARENT_CHECK_S)
    await drain(state, args.shutdown_timeout)
    await runner.cleanup()
    return 0


async def engine_core_state(
    args: argparse.Namespace, link: FrontLink, process: BaseProcess | None, log_phases: bool = True
) -> ServerState:
    """Connect to the engine core on `link` and load the tokenizer, early (while the core builds) where the
    command line says where it is. `process`: the core's, where this front end owns it."""
    early = early_tokenizer_source(args)
    load = timed_tokenizer_load if log_phases else untimed_tokenizer_load
    early_load = (
        asyncio.ensure_future(asyncio.to_thread(load, partial(checkpoint_tokenizer, early)))
        if early
        else None
    )
    if early_load is not None:  # its error, if any, is raised below only when its tokenizer is the one
        early_load.add_done_callback(lambda done: done.cancelled() or done.exception())
    connecting = asyncio.ensure_future(connect_engine_core(link, process, args.max_waiting))
    if early_load is not None:
        try:
            await asyncio.wait([early_load, connecting], return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled while starting: the connection's wait goes too
            connecting.cancel()
            raise
        if not connecting.done():  # the heap's bulk (modules, tokenizer) swept while the core builds
            freeze_heap()
    client = await connecting
    try:
        if early_load is not None and same_place(early, client.info.tokenizer_source):
            tokenizer = await early_load
        else:
            tokenizer = await asyncio.to_thread(load, client.info.load_tokenizer)
    except Exception:
        await client.close()  # the core is up: stop it (or leave it) before the error ends this process
        raise
    return ServerState(
        client.info, tokenizer, client, args.served_model_name or args.model, args.model, args.api_key
    )


async def listen(state: ServerState, args: argparse.Namespace, shared_port: bool) -> web.AppRunner:
    """Build the app and listen; `shared_port`: with SO_REUSEPORT, beside the other front ends."""
    runner = web.AppRunner(
        build_app(state, args.max_body_bytes),
        handle_signals=False,
        handler_cancellation=True,
        access_log=None,
    )
    await runner.setup()
    site = web.TCPSite(runner, args.host, args.port, reuse_port=shared_port or None)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    return runner


async def drain(state: ServerState, timeout: float) -> None:
    log.info("shutting down: draining %d requests for up to %.1f s", state.async_engine.num_active, timeout)
    aborted = await state.async_engine.drain(timeout)
    if aborted:
        log.info("aborted %d requests still running at the deadline", aborted)


def run(
    args: argparse.Namespace,
    started: float,
    core: StartedCore | None = None,
    extra: ExtraFrontends | None = None,
) -> int:
    """Serve until SIGTERM or SIGINT; `core`, `extra`: an engine core and extra front ends already started for
    these options."""
    try:
        return run_on_loop(serve(args, started, core, extra), args.event_loop)
    except (ValueError, FileNotFoundError, OSError) as exc:
        log.error("cannot start: %s", exc)
        return 2


def early_tokenizer_source(args: argparse.Namespace) -> str | None:
    """Where the tokenizer is when the command line alone says so (a local directory): the front end then
    loads it while the engine core starts (seconds, mostly importing transformers' tokenizer classes), not
    after. Built-in and random models are resolved by the core, so theirs waits for it."""
    source = args.tokenizer or args.model
    return source if Path(source).expanduser().is_dir() else None


def same_place(early: str, source: str | None) -> bool:
    """Whether the tokenizer the engine core settled on is the one loaded early."""
    return source is not None and Path(early).expanduser().resolve() == Path(source).expanduser().resolve()


def timed_tokenizer_load(load: Callable[[], PreTrainedTokenizerBase]) -> PreTrainedTokenizerBase:
    """Load the tokenizer and log how long it took (a start-up phase that compare reads from the log)."""
    start = time.perf_counter()
    tokenizer = load()
    log.info("tokenizer loaded in %.3f s", time.perf_counter() - start)
    return tokenizer


def untimed_tokenizer_load(load: Callable[[], PreTrainedTokenizerBase]) -> PreTrainedTokenizerBase:
    """An extra front end's load: its line would read as a second start-up phase."""
    return load()


def run_on_loop(main: Coroutine[Any, Any, int], kind: str) -> int:
    """Run the front end on uvloop's event loop where it is installed ("auto"), or on asyncio's own. Most of
    the front end's time per streamed token is event-loop work (a task woken and a socket written per stream
    per step), which uvloop does in C."""
    if kind != "asyncio":
        try:
            import uvloop
        except ImportError:
            if kind == "uvloop":
                raise
        else:
            return uvloop.run(main)
    return asyncio.run(main)


def log_start(args: argparse.Namespace) -> None:
    logging.basicConfig(level=args.log_level.upper(), format=LOG_FORMAT)
    log.info("starting llm-compare reference server %s, model %s", package_version(), args.model)
