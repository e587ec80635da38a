#!/usr/bin/env bash
# Real containers without a Docker engine or a registry: Debian's podman, serving the Docker API on a unix
# socket, with every bit of state under one run folder, and a Debian base image made locally with debootstrap.
#
#   .ci/setup_podman.sh RUN_DIR          set up (idempotent), start the API service, build/import the base image
#   .ci/setup_podman.sh --stop RUN_DIR   stop the API service this script started (images stay on disk;
#                                        after it, `rm -rf RUN_DIR` removes everything)
#
# Progress goes to stderr; on success the one line on stdout is `export DOCKER_HOST=unix://RUN_DIR/podman.sock`.
# RUN_DIR/env holds that line plus CONTAINERS_CONF, CONTAINERS_STORAGE_CONF and CONTAINERS_REGISTRIES_CONF, so
# the `podman` command itself works on the same store. A caller does
#   .ci/setup_podman.sh "$run_dir" && . "$run_dir/env"
# Runs as root (rootful podman, debootstrap, apt-get).
# See docs/containers.md for why each setting is there. Knobs (environment):
#   PODMAN_BASE_IMAGE     tag of the base image (default llm-compare/base:bookworm)
#   PODMAN_BASE_MIRROR    Debian mirror for debootstrap (default: the first bookworm `deb` source in
#                         /etc/apt/sources.list{,.d}, else http://deb.debian.org/debian)
#   PODMAN_BASE_PACKAGES  extra packages for the base image (default python3,python3-venv,ca-certificates)
#   PODMAN_REBUILD_BASE=1 debootstrap and import again even if the image and RUN_DIR/base-rootfs.tar exist
set -euo pipefail

stop=0
if [ "${1:-}" = --stop ]; then stop=1; shift; fi
run_dir=${1:?usage: $0 [--stop] RUN_DIR}
mkdir -p "$run_dir"
run_dir=$(cd "$run_dir" && pwd)

t0=$EPOCHREALTIME
log() { printf '[setup_podman %6ss] %s\n' "$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN {printf "%.1f", b - a}')" "$*" >&2; }

sock="$run_dir/podman.sock"
pid_file="$run_dir/podman.pid"
service_log="$run_dir/podman-service.log"
base_image=${PODMAN_BASE_IMAGE:-llm-compare/base:bookworm}
base_tar="$run_dir/base-rootfs.tar"
packages=${PODMAN_BASE_PACKAGES:-python3,python3-venv,ca-certificates}

service_alive() { [ -f "$pid_file" ] && kill -0 "$(cat "$pid_file")" 2>/dev/null; }
api_ping() { curl -fsS --max-time 2 --unix-socket "$sock" http://d/_ping >/dev/null 2>&1; }

if [ "$stop" = 1 ]; then
    if service_alive; then
        pid=$(cat "$pid_file")
        kill "$pid"
        for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
        kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
        log "stopped the podman API service (pid $pid)"
    else
        log "no podman API service running for $run_dir"
    fi
    rm -f "$pid_file" "$sock"
    # The overlay driver bind-mounts its own folder; release it so that `rm -rf RUN_DIR` works afterwards. While a
    # container still runs this fails (busy) and changes nothing.
    if findmnt -rn -o TARGET | grep -qxF "$run_dir/storage/overlay"; then
        umount "$run_dir/storage/overlay" 2>/dev/null || log "containers still running: $run_dir/storage stays mounted"
    fi
    exit 0
fi

if [ "$(id -u)" != 0 ]; then
    echo "$0 needs root: it installs packages, runs debootstrap and a rootful podman" >&2
    exit 1
fi
# A unix socket path must fit in sun_path (108 bytes with its NUL).
if [ "${#sock}" -gt 100 ]; then
    echo "RUN_DIR path too long for a unix socket ($sock); use a shorter RUN_DIR" >&2
    exit 1
fi

# 1. Packages. runc, not crun: crun refuses this kind of host's mixed cgroup v1/v2 layout. debootstrap for the
#    base image; curl to talk to the API socket; catatonit is the init process of `--init` containers.
need=()
for cmd_pkg in podman:podman runc:runc debootstrap:debootstrap curl:curl catatonit:catatonit; do
    cmd=${cmd_pkg%%:*} pkg=${cmd_pkg#*:}
    if [ "$cmd" = catatonit ]; then [ -x /usr/libexec/podman/catatonit ] || need+=("$pkg"); continue; fi
    command -v "$cmd" >/dev/null || [ -x "/usr/sbin/$cmd" ] || need+=("$pkg")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "[setup_podman] installing ${need[*]} with apt-get" >&2
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq >&2
    apt-get install -y -qq "${need[@]}" >&2
fi
log "podman $(podman --version | awk '{print $3}'), $(runc --version | head -n1)"

# 2. Configuration, all of it in RUN_DIR and selected by environment variables, so the machine's own
#    /etc/containers stays untouched and two run folders never share state.
# Containers join a bridge network of this RUN_DIR's own (name and interface from a hash of the path): podman's
# stock default network has the same bridge (podman0) and subnet in every store, so two run folders in use at
# once on one machine would hand out the same addresses on it.
net_name="llmc-$(printf '%s' "$run_dir" | sha256sum | cut -c1-8)"
hard_nofile=$(ulimit -Hn)
[ "$hard_nofile" = unlimited ] && hard_nofile=1048576
mkdir -p "$run_dir/storage" "$run_dir/run" "$run_dir/tmp" "$run_dir/networks"
cat > "$run_dir/containers.conf" <<EOF
# Written by .ci/setup_podman.sh: see docs/containers.md.
[containers]
# Podman's defaults ask for nofile 1048576, above this host's hard limit ($hard_nofile), which root cannot raise.
default_ulimits = ["nofile=$hard_nofile:$hard_nofile", "nproc=32768:32768"]
init_path = "/usr/libexec/podman/catatonit"
log_driver = "k8s-file"

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
events_logfile_path = "$run_dir/tmp/events.log"
tmp_dir = "$run_dir/tmp"
# Nothing is ever pulled: every image is built or imported here.
image_default_transport = "containers-storage:"

[network]
network_backend = "netavark"
network_config_dir = "$run_dir/networks"
EOF
cat > "$run_dir/storage.conf" <<EOF
# Written by .ci/setup_podman.sh: see docs/containers.md.
[storage]
driver = "overlay"
graphroot = "$run_dir/storage"
runroot = "$run_dir/run"
EOF
cat > "$run_dir/registries.conf" <<EOF
# Written by .ci/setup_podman.sh: no registry is searched for short names.
unqualified-search-registries = []
short-name-mode = "permissive"
EOF
export CONTAINERS_CONF="$run_dir/containers.conf"
export CONTAINERS_STORAGE_CONF="$run_dir/storage.conf"
export CONTAINERS_REGISTRIES_CONF="$run_dir/registries.conf"

# runroot and tmp_dir hold per-boot state (live containers, locks, the "alive" marker) and belong on a tmpfs.
# They live in RUN_DIR instead, so after a reboot clear them by hand, as a reboot clears a tmpfs.
boot_id=$(cat /proc/sys/kernel/random/boot_id)
if [ -f "$run_dir/boot_id" ] && [ "$(cat "$run_dir/boot_id")" != "$boot_id" ]; then
    log "machine rebooted since the last setup: clearing $run_dir/run and $run_dir/tmp"
    rm -f "$pid_file" "$sock"
    rm -rf "$run_dir/run" "$run_dir/tmp"
    mkdir -p "$run_dir/run" "$run_dir/tmp"
fi
echo "$boot_id" > "$run_dir/boot_id"

# The network is created before it becomes default_network: podman never writes its default network to disk
# and always gives it the bridge podman0, so the name must already have a configuration file of its own. Its
# subnet (10.89.N.0/24) and bridge name (llmcHASH) come from the hash too; podman 4.3 has no flag for the bridge
# name, so the file it wrote is edited. If that subnet is in use on the host, podman picks a free one.
net_file="$run_dir/networks/$net_name.json"
if [ ! -f "$net_file" ]; then
    subnet="10.89.$((16#${net_name:5:2})).0/24"
    podman network create --disable-dns --subnet "$subnet" "$net_name" >/dev/null 2>&1 \
        || podman network create --disable-dns "$net_name" >/dev/null
    sed -i -E "s/(\"network_interface\": *)\"[^\"]*\"/\1\"${net_name//-/}\"/" "$net_file"
    log "created network $net_name: $(podman network inspect -f '{{.NetworkInterface}} {{range .Subnets}}{{.Subnet}}{{end}}' "$net_name")"
fi
echo "default_network = \"$net_name\"" >> "$run_dir/containers.conf"

# 3. The API service.
if service_alive && api_ping; then
    log "podman API service already running (pid $(cat "$pid_file"))"
else
    if service_alive; then kill "$(cat "$pid_file")" 2>/dev/null || true; sleep 0.5; fi
    rm -f "$pid_file" "$sock"
    setsid podman system service --time=0 "unix://$sock" >>"$service_log" 2>&1 < /dev/null &
    echo $! > "$pid_file"
    for i in $(seq 300); do
        api_ping && break
        if ! service_alive; then
            echo "podman system service exited; its log ($service_log):" >&2
            tail -n 30 "$service_log" >&2
            exit 1
        fi
        [ "$i" = 300 ] && { echo "podman API did not answer on $sock within 30 s" >&2; exit 1; }
        sleep 0.1
    done
    log "podman API service answering on $sock (pid $(cat "$pid_file"))"
fi

# 4. The base image: a minimal Debian bookworm with python3, debootstrapped from the machine's apt mirror and
#    imported. The root filesystem is kept as RUN_DIR/base-rootfs.tar so that a second run only imports it.
rebuild=${PODMAN_REBUILD_BASE:-0}
if [ "$rebuild" != 1 ] && podman image exists "$base_image"; then
    log "base image $base_image present"
else
    if [ ! -s "$base_tar" ] || [ "$rebuild" = 1 ]; then
        mirror=${PODMAN_BASE_MIRROR:-}
        if [ -z "$mirror" ]; then
            # deb822 files (URIs:/Suites:) and one-line sources (deb URI SUITE ...), first bookworm source wins.
            mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | awk '
                /^URIs:/ {uri=$2} /^Suites:/ {for (i=2; i<=NF; i++) if ($i=="bookworm") {print uri; exit}}
                /^$/ {uri=""}')
            [ -n "$mirror" ] || mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null \
                | awk '$1=="deb" && $0 ~ / bookworm / {for (i=2; i<=NF; i++) if ($i ~ /^[a-z]+:\/\//) {print $i; exit}}')
            mirror=${mirror:-http://deb.debian.org/debian}
        fi
        rootfs="$run_dir/base-rootfs"
        # debootstrap mounts /proc and /sys in the target; a run that died may have left them mounted.
        unmount_rootfs() {
            findmnt -rn -o TARGET | grep -F "$rootfs/" | sort -r | while read -r m; do umount -l "$m"; done || true
        }
        unmount_rootfs
        rm -rf "$rootfs" "$base_tar.tmp"
        log "debootstrap --variant=minbase --include=$packages bookworm from $mirror"
        debootstrap --variant=minbase --include="$packages" bookworm "$rootfs" "$mirror" \
            > "$run_dir/debootstrap.log" 2>&1 \
            || { unmount_rootfs; tail -n 30 "$run_dir/debootstrap.log" >&2; echo "debootstrap failed" >&2; exit 1; }
        unmount_rootfs
        rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* "$rootfs"/var/log/*.log \
            "$rootfs"/tmp/* "$rootfs"/debootstrap
        tar --numeric-owner --xattrs -C "$rootfs" -cf "$base_tar.tmp" .
        mv "$base_tar.tmp" "$base_tar"
        rm -rf "$rootfs"
        log "base root filesystem: $(du -h "$base_tar" | cut -f1) in $base_tar"
    else
        log "reusing $base_tar"
    fi
    podman import -q \
        --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
        --change 'ENV LANG=C.UTF-8' \
        --change 'CMD ["/usr/bin/python3"]' \
        --change 'LABEL org.opencontainers.image.title=llm-compare-base' \
        --change "LABEL org.opencontainers.image.description=Debian bookworm minbase with $packages" \
        --message "debootstrap --variant=minbase --include=$packages bookworm" \
        "$base_tar" "$base_image" >/dev/null
    log "imported $base_image"
fi
# A real container, as a check that the runtime, cgroups, ulimits and init all work here.
py=$(podman run --rm --init --network none "$base_image" python3 -c 'import platform, ssl, venv; print(platform.python_version())') \
    || { echo "could not run a container from $base_image" >&2; exit 1; }
log "a container from $base_image runs: python $py, $(podman image inspect -f '{{.Size}}' "$base_image" \
    | awk '{printf "%.0f MB", $1 / 1e6}')"

cat > "$run_dir/env" <<EOF
export DOCKER_HOST=unix://$sock
export CONTAINERS_CONF=$run_dir/containers.conf
export CONTAINERS_STORAGE_CONF=$run_dir/storage.conf
export CONTAINERS_REGISTRIES_CONF=$run_dir/registries.conf
EOF
log "ready; stop the service with: $0 --stop $run_dir"
echo "export DOCKER_HOST=unix://$sock"
