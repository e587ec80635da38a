#!/usr/bin/env bash
# Rebuilds the report of every committed run directory under benchmarks/results/ from its own files
# (`compare report`: summary.csv, report.md, report.html), so that the committed reports follow the current
# metric definitions and verdicts. A directory that kept no request records (only its summary) cannot be
# rebuilt and is listed, untouched.
#   bash benchmarks/rebuild_reports.sh [RESULTS_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
root=${1:-benchmarks/results}
skipped=()
while IFS= read -r manifest; do
  dir=$(dirname "$manifest")
  if [ -e "$dir/requests.jsonl" ] || [ -e "$dir/requests.jsonl.xz" ]; then
    echo "+ compare report $dir"
    python -m compare.cli report "$dir" >/dev/null
  else
    skipped+=("$dir")
  fi
done < <(find "$root" -name manifest.json | sort)
for dir in "${skipped[@]}"; do
  echo "not rebuilt (no request records kept): $dir"
done
