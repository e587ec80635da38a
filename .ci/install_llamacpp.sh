#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU only, Release) into DIR/bin, from the llama.cpp source that the
# llama-cpp-python sdist on PyPI vendors (PyPI is the one source registry every machine of this project
# reaches). Only the server target is built; no libcurl, no OpenSSL.
#
#   .ci/install_llamacpp.sh DIR
#
# Idempotent: if DIR/bin/llama-server exists and answers --version, nothing is done. Afterwards point
# llm-compare at it with `export LLM_COMPARE_LLAMACPP=DIR/bin/llama-server` (or `--llamacpp-bin`).
# Knobs (environment):
#   LLAMACPP_PY_VERSION   llama-cpp-python release whose vendored llama.cpp is built (default 0.3.36)
#   LLAMACPP_JOBS         parallel compile jobs (default 2)
#   LLAMACPP_NATIVE       ON (default): kernels tuned for this machine's CPU (build where you run); OFF: a
#                         portable x86-64 build (a container image meant for other hosts)
#   LLAMACPP_REBUILD=1    build again even if DIR already has a working llama-server
set -euo pipefail

dir=${1:?usage: $0 DIR}
version=${LLAMACPP_PY_VERSION:-0.3.36}
jobs=${LLAMACPP_JOBS:-2}

t0=$(date +%s)
log() { printf '[install_llamacpp %4ds] %s\n' "$(($(date +%s) - t0))" "$*"; }

mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
bin="$dir/bin/llama-server"

if [ "${LLAMACPP_REBUILD:-0}" != 1 ] && [ -x "$bin" ] && out=$("$bin" --version 2>&1); then
    log "$bin already built ($(printf '%s' "$out" | grep -m1 -i version || true)); nothing to do"
    exit 0
fi
for tool in cmake c++ python3; do
    command -v "$tool" >/dev/null || { echo "install_llamacpp: '$tool' is needed to build llama-server" >&2; exit 1; }
done

work="$dir/.build"
rm -rf "$work"
mkdir -p "$work"
trap 'rm -rf "$work"' EXIT

# 1. The source: llama-cpp-python's sdist (pip download, no build), which carries vendor/llama.cpp.
log "downloading the llama-cpp-python==$version sdist"
python3 -m pip download -q --disable-pip-version-check --no-input --no-deps --no-binary :all: \
    -d "$work" "llama-cpp-python==$version"
sdist=$(ls "$work"/llama_cpp_python-*.tar.gz)
tar -xzf "$sdist" -C "$work"
src=$(ls -d "$work"/llama_cpp_python-*/vendor/llama.cpp)
[ -f "$src/CMakeLists.txt" ] || { echo "install_llamacpp: no vendor/llama.cpp in $sdist" >&2; exit 1; }

# 2. Configure: Release, CPU backend only, no network (curl) and no TLS, no tests or examples beyond the server.
#    GGML_NATIVE tunes the kernels for this machine's CPU: build where you run.
log "configuring ($src)"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$src" -B "$work/build" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE="${LLAMACPP_NATIVE:-ON}" \
    -DGGML_CUDA=OFF -DGGML_METAL=OFF -DGGML_VULKAN=OFF -DGGML_OPENMP=ON \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TOOLS=ON >"$work/configure.log" 2>&1 \
    || { tail -n 40 "$work/configure.log" >&2; echo "install_llamacpp: cmake configure failed" >&2; exit 1; }

# 3. Build the server target only.
log "building llama-server with $jobs jobs"
cmake --build "$work/build" --config Release --target llama-server -j "$jobs" >"$work/build.log" 2>&1 \
    || { tail -n 40 "$work/build.log" >&2; echo "install_llamacpp: build failed" >&2; exit 1; }

mkdir -p "$dir/bin"
cp "$work/build/bin/llama-server" "$bin.tmp"
mv "$bin.tmp" "$bin"
out=$("$bin" --version 2>&1) || { echo "$out" >&2; echo "install_llamacpp: llama-server --version failed" >&2; exit 1; }
printf '%s\n' "$version" > "$dir/.llama-cpp-python-version"
log "llama-server --version: $(printf '%s' "$out" | grep -m1 -i version || true)"
log "done: $bin; took $(($(date +%s) - t0)) s"
