"""A run directory's per-request records made small enough to commit: every float rounded to the microsecond
(the clocks' useful resolution; events stay in order, ties stay ties) and the file compressed to
`requests.jsonl.xz`, which `compare report` reads in place. Rebuild the reports from the compacted records
afterwards (`python -m compare.cli report RUN`), so that what is committed is what the records give.

    python benchmarks/compact_records.py RUN_DIR [--keep]
"""

from __future__ import annotations

import argparse
import json
import lzma
from pathlib import Path
from typing import Any


def rounded(value: Any, digits: int = 6) -> Any:
    """`value` with every float in it rounded to `digits` decimals."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, list):
        return [rounded(v, digits) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v, digits) for k, v in value.items()}
    return value


def compact(run: Path, keep: bool = False) -> Path:
    source, target = run / "requests.jsonl", run / "requests.jsonl.xz"
    with source.open() as lines, lzma.open(target, "wt", preset=9 | lzma.PRESET_EXTREME) as out:
        for line in lines:
            if line.strip():
                out.write(json.dumps(rounded(json.loads(line)), separators=(",", ":")) + "\n")
    if not keep:
        source.unlink()
    return target


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("run", type=Path)
    p.add_argument("--keep", action="store_true", help="keep requests.jsonl beside the compressed copy")
    args = p.parse_args()
    target = compact(args.run, args.keep)
    print(f"{target}: {target.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
