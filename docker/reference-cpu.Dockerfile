# The reference engine's server on CPU, built with no network: FROM the local Debian base image made by
# .ci/setup_podman.sh, with every Python package taken from a build context made on the host.
#
#   docker/prepare_reference_context.sh CTX                     # wheels, the project wheel, this file
#   docker build -f CTX/reference-cpu.Dockerfile -t llm-compare/reference-cpu CTX
#   docker run --init -p 127.0.0.1:8000:8000 -v /path/to/checkpoint:/models:ro llm-compare/reference-cpu
#   docker run ... llm-compare/reference-cpu --model /models --max-model-len 1024   # arguments replace CMD
#
# The base is any glibc (2.28+) image whose `python3` on PATH is CPython 3.11 with venv (the wheels are cp311):
# on a Docker host without our base image, --build-arg BASE_IMAGE=python:3.11-slim-bookworm. See docs/containers.md.
ARG BASE_IMAGE=llm-compare/base:bookworm
FROM ${BASE_IMAGE}

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    LLM_COMPARE_CACHE=/cache

RUN python3 -m venv /opt/venv

# Dependencies (torch's CPU build and the rest), offline. The wheels are bind-mounted rather than copied, so
# they never become a layer; podman's builder does not hash a bind mount's contents into its cache key, so the
# checksum list is copied first: a changed set of wheels changes it and reruns the install.
COPY wheels/SHA256SUMS /opt/venv/dependency-wheels.sha256
RUN --mount=type=bind,source=wheels,target=/wheels \
    pip install --no-index --find-links /wheels /wheels/*.whl \
    && pip check

# The project itself, last: it changes most often and installs in seconds.
COPY project/ /tmp/project/
RUN pip install --no-index --no-deps /tmp/project/*.whl && rm -rf /tmp/project \
    && python -c "import reference_engine.server, torch; print('torch', torch.__version__)"

# The engine's C kernels, compiled on the build host for its CPU (the image has no compiler): used where the image
# runs on that CPU, ignored (torch path) elsewhere.
COPY kernel-cache/ /cache/

# Runs as root, like the vLLM and TGI images: checkpoints are often saved owner-only (safetensors writes
# 0600), and a mounted folder keeps the host's owners. Pass --user UID:GID where the files allow it.
RUN mkdir -p /models /cache
WORKDIR /cache

LABEL org.opencontainers.image.title="llm-compare reference engine (CPU)" \
      org.opencontainers.image.licenses="Apache-2.0"
EXPOSE 8000
# For engines that run health checks (Docker does; podman needs systemd timers for it, so without systemd the
# status stays "starting" and callers poll GET /health themselves). Assumes the default --port 8000.
HEALTHCHECK --interval=5s --timeout=3s --start-period=10m --retries=3 \
    CMD ["/opt/venv/bin/python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=2)"]
# The checkpoint directory is expected at /models (mount it read-only); SIGTERM drains running requests for up
# to --shutdown-timeout seconds. Run with an init process (docker run --init) so signals reach the server
# promptly. Extra server flags go after the image name and replace CMD, so repeat --model there.
ENTRYPOINT ["/opt/venv/bin/python", "-m", "reference_engine.server", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--model", "/models"]
