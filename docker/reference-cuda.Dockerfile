# The reference engine's server on an NVIDIA GPU. Built on a GPU host with Docker and registry access (it cannot
# be built on our CI machines, which reach no container registry); the build context is the repository root:
#
#   docker build -f docker/reference-cuda.Dockerfile -t llm-compare/reference-cuda .
#   docker run --gpus all --init --shm-size 8g -p 127.0.0.1:8000:8000 -v /path/to/checkpoint:/models:ro \
#       -v llm-compare-reference-cache:/cache llm-compare/reference-cuda --model /models --max-model-len 4096
#
# PyTorch's official runtime image brings CUDA, cuDNN and a CUDA build of torch (Python 3.11 in /opt/conda), so
# the project installs on top of it without touching torch. Pick the tag that matches the host's driver with
# --build-arg PYTORCH_IMAGE=pytorch/pytorch:<torch>-cuda<X.Y>-cudnn9-runtime. docker/compose.yaml builds it too.
ARG PYTORCH_IMAGE=pytorch/pytorch:2.9.0-cuda12.8-cudnn9-runtime
FROM ${PYTORCH_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LLM_COMPARE_CACHE=/cache \
    HF_HOME=/cache/huggingface \
    TRITON_CACHE_DIR=/cache/triton
# /cache holds the engine's compiled Triton kernels: mount a volume there (compose.yaml and `compare run
# --launch docker` do) so that only the first start on a host compiles them (7-9 s of a 7B's start-up on an H200)

# Dependencies first, from pyproject alone, so that source edits do not reinstall them. torch is already there
# (the CUDA build); pip keeps it because it satisfies the project's requirement.
# REQUIRE_CUDA_TORCH=0 lets the recipe be checked on a base whose torch is a CPU build.
ARG REQUIRE_CUDA_TORCH=1
COPY pyproject.toml README.md /src/
RUN python -c "import tomllib; deps = tomllib.load(open('/src/pyproject.toml', 'rb'))['project']['dependencies']; \
print('\n'.join(d for d in deps if not d.startswith('torch')))" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt && rm /tmp/requirements.txt \
    && python -c "import sys, torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda); \
sys.exit('the base image has no CUDA build of torch' if sys.argv[1] == '1' and not torch.version.cuda else 0)" \
        "$REQUIRE_CUDA_TORCH"

COPY reference_engine /src/reference_engine
COPY adapters /src/adapters
COPY workloads /src/workloads
COPY compare /src/compare
RUN pip install --no-deps /src && rm -rf /src \
    && python -c "import reference_engine.server"

RUN mkdir -p /models /cache
WORKDIR /cache
LABEL org.opencontainers.image.title="llm-compare reference engine (CUDA)" \
      org.opencontainers.image.licenses="Apache-2.0"
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=10m --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=3)"]
# Same interface as the CPU image: arguments after the image name replace CMD (repeat --model there).
ENTRYPOINT ["python", "-m", "reference_engine.server", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--model", "/models"]
