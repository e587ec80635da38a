#!/usr/bin/env bash
# The served comparison on one GPU: `compare run` launching vLLM (from an offline bundle) and our engine on the
# same real checkpoint (random bf16 weights of a named shape, the built-in SmolLM2 tokenizer), closed-loop points
# and one open-loop rate point, IN_LEN prompt tokens and exactly OUT_LEN output tokens per request, every
# request a prompt of its own, each point bounded by time, the serving settings matched (`--match-serving`, the
# default: the same HTTP front-end count, max sequences and batch budget) and each server launched REPEATS times
# in alternating order. Run from the repository's root on the GPU machine; writes the run directory to $OUT/run.
#
#   SHAPE=llama-2-7b RATE=45 bash benchmarks/h200_serving/run.sh
#
# Needs: VLLM_SITE, a folder holding vLLM and the packages it needs beyond the machine's (unpacked bundle;
# default /tmp/site); TOKENIZER, a folder with the SmolLM2 tokenizer's files (made on
# a machine with the built-in model by `python -m reference_engine.builtin_models` and copying tokenizer.json,
# tokenizer_config.json and chat_template.jinja). Optional: CONC (default 1,16,64,128,256), DURATION (default
# 22s: at least 20 s of steady state at every point), REPEATS (default 2), IN_LEN / OUT_LEN (default 512 / 128),
# BACKENDS (default reference,vllm), or CONFIG, a run file naming the backends instead (context_bounds.yaml);
# NUM_REQUESTS (default 0: each point bounded by DURATION alone; its prompts are made while it runs, and the
# manifest's point entry says whether the load generator ever waited for one).
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
  --dataset random --input-len "${IN_LEN:-512}" --output-len "${OUT_LEN:-128}" \
  --concurrency "${CONC:-1,16,64,128,256}" "${rate_args[@]}" --repeats "${REPEATS:-2}" \
  --num-requests "${NUM_REQUESTS:-0}" --duration "${DURATION:-22s}" --out "$out/run" \
  || echo "compare run exited with $?"
