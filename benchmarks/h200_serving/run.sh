#!/usr/bin/env bash
# The served comparison on one GPU: `compare run` launching vLLM (from an offline bundle) and our engine on the
# same real checkpoint (random bf16 weights of a named shape, the built-in SmolLM2 tokenizer), closed-loop points
# and one open-loop rate point, 512 prompt tokens and exactly 128 output tokens per request, each point bounded by
# time. Run from the repository's root on the GPU machine; writes the run directory to $OUT/run.
#
#   SHAPE=llama-3.2-1b RATE=60 bash benchmarks/h200_serving/run.sh
#
# Needs: VLLM_SITE, a folder holding vLLM and the packages it needs beyond the machine's (unpacked bundle;
# default /tmp/site); TOKENIZER, a folder with the SmolLM2 tokenizer's files (made on
# a machine with the built-in model by `python -m reference_engine.builtin_models` and copying tokenizer.json,
# tokenizer_config.json and chat_template.jinja). Optional: CONC (default 1,16,64,128), DURATION (default 16s),
# BACKENDS (default reference,vllm), or CONFIG, a run file naming the backends instead (context_bounds.yaml);
# NUM_REQUESTS (default 0: each point bounded by DURATION alone, with a pool of 256 prompts that the load
# generator cycles once sent, so a prefix cache answers the repeats; give at least the requests the fastest
# point completes in DURATION, e.g. 5000 for the 1B at c=128, for a prompt of its own per request, at the
# cost of generating them: about 8 ms a prompt on a loaded 2-core machine).
set -euo pipefail
shape=${SHAPE:?SHAPE, e.g. llama-2-7b}
site=${VLLM_SITE:-/tmp/site}
tokenizer=${TOKENIZER:?TOKENIZER: a folder with the SmolLM2 tokenizer files}
out=${OUT:?OUT: where the run directory goes}
export PYTHONPATH=$site:$PWD${PYTHONPATH:+:$PYTHONPATH} VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 \
  TRANSFORMERS_OFFLINE=1
bin=$(mktemp -d)
printf '#!/bin/sh\nexec python3 -m vllm.entrypoints.cli.main "$@"\n' > "$bin/vllm" && chmod +x "$bin/vllm"
ckpt=/tmp/ckpt-$shape
[ -f "$ckpt/model.safetensors" ] || [ -f "$ckpt/model.safetensors.index.json" ] \
  || python3 benchmarks/h200_serving/random_checkpoint.py "$ckpt" "$shape" --tokenizer "$tokenizer"
rate_args=()
[ -z "${RATE:-}" ] || rate_args=(--rate "$RATE")
backend_args=(--backends "${BACKENDS:-reference,vllm}")
[ -z "${CONFIG:-}" ] || backend_args=(--config "$CONFIG")
python3 -m compare.cli run "${backend_args[@]}" --vllm-bin "$bin/vllm" --model "$ckpt" \
  --dataset random --input-len 512 --output-len 128 --concurrency "${CONC:-1,16,64,128}" "${rate_args[@]}" \
  --num-requests "${NUM_REQUESTS:-0}" --duration "${DURATION:-16s}" --out "$out/run" \
  || echo "compare run exited with $?"
