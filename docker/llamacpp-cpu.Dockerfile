# llama.cpp's llama-server on CPU, built from the same pinned source as .ci/install_llamacpp.sh (the llama.cpp
# that the llama-cpp-python sdist on PyPI vendors), for `compare run --launch docker --backends llamacpp`.
# The build stage needs Debian's packages and PyPI; the image it leaves holds the server and libgomp only.
#
#   docker build -f docker/llamacpp-cpu.Dockerfile -t llm-compare/llamacpp-cpu .        # from the repo root
#   docker run --init -p 127.0.0.1:8000:8000 -v /dir/with/gguf:/models:ro llm-compare/llamacpp-cpu \
#       --model /models/model.gguf --host 0.0.0.0 --port 8000 --parallel 4 --metrics
#
# The kernels are tuned for the build host's CPU (LLAMACPP_NATIVE=ON, as for a local build): build on the
# machine that runs it, or pass --build-arg LLAMACPP_NATIVE=OFF for a portable (slower) x86-64 build.
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE} AS build
ARG LLAMACPP_PY_VERSION=0.3.36
ARG LLAMACPP_NATIVE=ON
ARG LLAMACPP_JOBS=2
RUN apt-get update \
    && apt-get install -y --no-install-recommends cmake ninja-build g++ python3 python3-pip libgomp1 \
    && rm -rf /var/lib/apt/lists/*
COPY .ci/install_llamacpp.sh /src/install_llamacpp.sh
RUN PIP_BREAK_SYSTEM_PACKAGES=1 LLAMACPP_PY_VERSION=${LLAMACPP_PY_VERSION} LLAMACPP_NATIVE=${LLAMACPP_NATIVE} \
    LLAMACPP_JOBS=${LLAMACPP_JOBS} bash /src/install_llamacpp.sh /opt/llamacpp

FROM ${BASE_IMAGE}
RUN apt-get update && apt-get install -y --no-install-recommends libgomp1 curl \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/llamacpp/bin/llama-server /usr/local/bin/llama-server
RUN mkdir -p /models && llama-server --version
LABEL org.opencontainers.image.title="llama.cpp llama-server (CPU) for llm-compare" \
      org.opencontainers.image.licenses="MIT"
EXPOSE 8000
HEALTHCHECK --interval=5s --timeout=3s --start-period=5m --retries=3 \
    CMD ["curl", "-fs", "http://127.0.0.1:8000/health"]
# The GGUF file's folder is expected at /models (mount it read-only); the arguments name the file, the
# address and the rest (compare's launch spec gives them all).
ENTRYPOINT ["/usr/local/bin/llama-server"]
CMD ["--host", "0.0.0.0", "--port", "8000", "--model", "/models/model.gguf"]
