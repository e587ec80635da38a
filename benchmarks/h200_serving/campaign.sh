#!/usr/bin/env bash
# Several served comparisons (run.sh) one after another, for a GPU lease whose calls are shorter than the
# runs: start it detached (setsid) and read RESULTS/progress.log between calls. Each finished run directory is
# packed into RESULTS/<name>.tar.xz; an interrupted one (SIGINT to compare writes every finished record and a
# partial report) can be packed with `pack NAME`. First the device's copy bandwidth (RESULTS/copy-bandwidth.json),
# the rate under the bandwidth floors of the READMEs.
#
#   setsid nohup bash benchmarks/h200_serving/campaign.sh RESULTS 7b:llama-2-7b:45:512:128 1b:llama-3.2-1b:100 &
#
# Each SPEC is NAME:SHAPE[:RATE[:IN_LEN[:OUT_LEN[:CONC]]]] (CONC with '+' for ',', e.g. 16+64); the rest of
# run.sh's settings come from the environment (VLLM_SITE, TOKENIZER, DURATION, REPEATS).
set -uo pipefail
results=${1:?RESULTS directory}; shift
mkdir -p "$results"
log=$results/progress.log
say() { echo "$(date -u +%H:%M:%S) $*" >> "$log"; }
if [ "${1:-}" = pack ]; then
  tar -C "$results" -cJf "$results/$2.tar.xz" "$2" && say "packed $2"; exit
fi
python3 - "$results/copy-bandwidth.json" <<'PY'
import json, sys, torch
x = torch.empty(2 << 30, dtype=torch.uint8, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20): y.copy_(x)
end.record(); torch.cuda.synchronize()
rate = 2 * x.numel() * 20 / (start.elapsed_time(end) / 1e3)
json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
           "copy_bytes_per_s": rate, "what": "device-to-device copy of 2 GiB, bytes read + written per second"},
          open(sys.argv[1], "w"), indent=1)
PY
say "copy bandwidth measured"
for spec in "$@"; do
  IFS=: read -r name shape rate in_len out_len conc <<< "$spec"
  say "start $name ($spec)"
  SHAPE=$shape RATE=$rate IN_LEN=${in_len:-512} OUT_LEN=${out_len:-128} CONC=${conc:+${conc//+/,}} \
    OUT=$results/$name bash benchmarks/h200_serving/run.sh > "$results/$name.console.txt" 2>&1
  cp "$results/$name.console.txt" "$results/$name/run/console.txt" 2>/dev/null
  tar -C "$results" -cJf "$results/$name.tar.xz" "$name" && say "done $name"
done
say "all done"
