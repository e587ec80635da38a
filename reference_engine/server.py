"""The reference server's command line: `python -m reference_engine.server --model smollm2-135m --port 8000`.

The server itself (the aiohttp app, its handlers, `parse_args`) lives in reference_engine/serving/server.py.
"""

from reference_engine.serving.server import main, parse_args

__all__ = ["main", "parse_args"]

if __name__ == "__main__":
    raise SystemExit(main())
