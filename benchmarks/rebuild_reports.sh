#!/usr/bin/env bash
# Rebuilds the report of every committed run directory under benchmarks/results/ from its own files
# (`compare report`: summary.csv, report.md, report.html), so that the committed reports follow the current
# metric definitions and verdicts. A directory that kept no request records (only its summary) cannot be
# rebuilt and is listed, untouched (the READMEs beside the runs say how to bring records back from git). What `compare report` writes beside that a committed directory did not
# keep (summary.parquet, which summary.csv repeats; report.html where only report.md was kept) is removed, so
# that the tracked tree stays small.
#   bash benchmarks/rebuild_reports.sh [RESULTS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:-benchmarks/results}
skipped=()
while IFS= read -r manifest; do
  dir=$(dirname "$manifest")
  if [ -e "$dir/requests.jsonl" ] || [ -e "$dir/requests.jsonl.xz" ]; then
    echo "+ compare report $dir"
    had_html=0
    [ -e "$dir/report.html" ] && had_html=1
    python -m compare.cli report "$dir" >/dev/null
    rm -f "$dir/summary.parquet"
    [ "$had_html" -eq 1 ] || rm -f "$dir/report.html"
  else
    skipped+=("$dir")
  fi
done < <(find "$root" -name manifest.json | sort)
for dir in "${skipped[@]}"; do
  echo "not rebuilt (no request records kept): $dir"
done
