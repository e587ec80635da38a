"""The reference server's command line: `python -m reference_engine.server --model smollm2-135m --port 8000`.

With the engine core in its own process (the default), the core (and any extra front-end processes,
`--api-server-count`) is started first, before this process imports the HTTP front end
(reference_engine/serving/server.py), so that the processes start side by side rather than one after the
other: the core imports torch and builds the engine while the front ends import aiohttp and load the
tokenizer.
"""

from __future__ import annotations

import contextlib
import time


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    from reference_engine.serving.core_process import LOG_FORMAT, start_engine_core
    from reference_engine.serving.frontends import ExtraFrontends, share_metrics_between_processes
    from reference_engine.serving.options import engine_config, parse_args

    args = parse_args(argv)
    core = extra = None
    if args.api_server_count > 1:
        share_metrics_between_processes()
    if args.engine_process:
        # A bad setting raises here and again as the server starts, which reports it as any start-up error.
        with contextlib.suppress(ValueError):
            core = start_engine_core(
                engine_config(args),
                args.cpu_threads,
                args.log_level.upper(),
                LOG_FORMAT,
                args.api_server_count,
            )
            extra = ExtraFrontends(args, core.links[1:]) if args.api_server_count > 1 else None
    from reference_engine.serving.server import log_start, run

    log_start(args)
    return run(args, started, core, extra)


if __name__ == "__main__":
    raise SystemExit(main())
