"""Our load generator as a command of its own, so that it is measured like the other clients: a separate
process, started cold, its whole CPU time counted.

    python benchmarks/truth/ours.py --url http://127.0.0.1:PORT --concurrency 64 --requests 128 \
        --warmup 64 --output-tokens 32 [--chat] --out requests.jsonl
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from adapters import get_adapter
from adapters.request_spec import RequestSpec
from workloads.loadgen import PointJob, run_load_sync
from workloads.schedule import ClosedLoop

PROMPT_IDS = tuple(range(1000, 1016))  # 16 prompt tokens, as the other clients are asked for
PROMPT_TEXT = " ".join(f"w{i}" for i in range(16))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--requests", type=int, required=True)
    parser.add_argument("--warmup", type=int, default=0, help="warm-up requests before the measured ones")
    parser.add_argument("--output-tokens", type=int, required=True)
    parser.add_argument("--chat", action="store_true", help="/v1/chat/completions instead of /v1/completions")
    parser.add_argument("--model", default="scripted-model")
    parser.add_argument("--request-id-prefix", default="ours-")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument(
        "--busy-poll",
        action="store_true",
        help="keep the client's CPU polling (workloads.loadgen.keep_awake)",
    )
    args = parser.parse_args(argv)

    def specs(prefix: str, n: int) -> list[RequestSpec]:
        return [RequestSpec(f"{prefix}{i}", PROMPT_IDS, PROMPT_TEXT, args.output_tokens) for i in range(n)]

    adapter = get_adapter("vllm-chat" if args.chat else "vllm", model=args.model)
    args.out.unlink(missing_ok=True)
    records = run_load_sync(
        PointJob(
            args.url,
            adapter,
            specs(args.request_id_prefix, args.requests),
            ClosedLoop(args.concurrency),
            warmup_specs=specs(f"{args.request_id_prefix}warm-", args.warmup),
            output_path=args.out,
            summary_path=args.out.with_name("ours-runs.jsonl"),
            busy_poll=args.busy_poll,
        )
    )
    failed = sum(not r.ok for r in records)
    print(f"{len(records)} requests, {failed} failed", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
