#!/usr/bin/env bash
# Make the build context of the reference engine's CPU image, so that the image builds with no network at all:
#
#   docker/prepare_reference_context.sh CTX_DIR
#   docker build -f CTX_DIR/reference-cpu.Dockerfile -t llm-compare/reference-cpu CTX_DIR
#
# CTX_DIR gets
#   reference-cpu.Dockerfile   a copy of docker/reference-cpu.Dockerfile
#   project/                   this project as a wheel (pip wheel --no-deps)
#   wheels/                    every dependency as a wheel for CPython 3.11 on manylinux x86_64 (Debian
#                              bookworm's python3), torch's CPU build included; SHA256SUMS lists them
#   kernel-cache/              the engine's C kernels compiled here for this CPU
#                              (reference_engine/kernels/cpu_kernels.py), so the image, which has no compiler, runs them on this machine; empty if this
#                              host cannot build them (the image then runs the torch path, and says so)
# The host's pip does the downloading, with the host's pip configuration (index, find-links, certificates).
# Knobs (environment):
#   PYTHON               interpreter whose pip is used (default python3); any version, it downloads for 3.11
#   REFERENCE_TORCH      torch requirement (default torch==2.13.0+cpu: the CPU build, 180 MB, not the CUDA one)
#   REFERENCE_TORCH_INDEX  extra index that serves that build (PyTorch's CPU wheel index), for machines that do
#                        not have the wheel in a find-links folder (pip's PIP_FIND_LINKS); unset by default
# Re-running refreshes CTX_DIR; pip's cache makes that quick.
set -euo pipefail

ctx=${1:?usage: $0 CTX_DIR}
here=$(cd "$(dirname "$0")" && pwd)
project=$(cd "$here/.." && pwd)
py=${PYTHON:-python3}
torch_req=${REFERENCE_TORCH:-torch==2.13.0+cpu}
t0=$EPOCHREALTIME
log() { printf '[prepare_reference_context %6ss] %s\n' "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')" "$*" >&2; }

mkdir -p "$ctx"
ctx=$(cd "$ctx" && pwd)
pip_args=(--disable-pip-version-check --no-input -q)
[ -n "${REFERENCE_TORCH_INDEX:-}" ] && pip_args+=(--extra-index-url "$REFERENCE_TORCH_INDEX")

# 1. The project as a wheel, built from a copy of the package sources (so no build/ or *.egg-info is left in
#    the work tree).
src=$(mktemp -d)
trap 'rm -rf "$src"' EXIT
cp "$project/pyproject.toml" "$project/README.md" "$src/"
for pkg in reference_engine adapters workloads compare; do
    cp -r "$project/$pkg" "$src/"
done
find "$src" -name __pycache__ -prune -exec rm -rf {} +
rm -rf "$ctx/project"
mkdir -p "$ctx/project"
# (the build's own chatter, setuptools' deprecation notices, shown only if it fails)
"$py" -m pip wheel "${pip_args[@]}" --no-deps -w "$ctx/project" "$src" > "$src/wheel.log" 2>&1 \
    || { cat "$src/wheel.log" >&2; echo "building the project wheel failed" >&2; exit 1; }
project_wheel=$(ls "$ctx/project"/*.whl)
log "project wheel: $(basename "$project_wheel")"

# 2. Its dependencies, resolved for the image's interpreter (CPython 3.11, glibc 2.36) rather than the host's,
#    into an empty folder so that exactly the resolved set is there (pip's cache makes a repeat cheap).
#    pip does not widen a --platform to the older manylinux tags a glibc 2.36 system also runs, so name them all.
platforms=()
for minor in $(seq 36 -1 5); do platforms+=(--platform "manylinux_2_${minor}_x86_64"); done
platforms+=(--platform manylinux2014_x86_64 --platform manylinux2010_x86_64 --platform manylinux1_x86_64)
rm -rf "$ctx/wheels"
mkdir -p "$ctx/wheels"
"$py" -m pip download "${pip_args[@]}" -d "$ctx/wheels" --only-binary=:all: \
    --python-version 3.11 --implementation cp --abi cp311 "${platforms[@]}" \
    "$torch_req" "$project_wheel" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2) >&2
rm -f "$ctx/wheels"/llm_compare-*.whl
(cd "$ctx/wheels" && sha256sum -- *.whl > SHA256SUMS)
log "$(find "$ctx/wheels" -name "*.whl" | wc -l) dependency wheels, $(du -sh "$ctx/wheels" | cut -f1)"

# 3. The C kernels, built for this host's CPU into the cache layout the image's engine looks in (LLM_COMPARE_CACHE
#    is /cache there). Their cache key is the sources, flags and CPU model: on another CPU the image ignores them.
rm -rf "$ctx/kernel-cache"
mkdir -p "$ctx/kernel-cache"
if LLM_COMPARE_CACHE="$ctx/kernel-cache" PYTHONPATH="$project" "$py" -c \
    "import sys; from reference_engine.kernels.cpu_kernels import load_kernel; sys.exit(load_kernel() is None)" 2>/dev/null; then
    log "C kernels: $(ls "$ctx/kernel-cache/kernels")"
else
    log "C kernels: not built here (no compiler, or the project does not import); the image runs the torch path"
    rm -rf "$ctx/kernel-cache"/*
fi

cp "$here/reference-cpu.Dockerfile" "$ctx/"
log "context ready in $ctx"
