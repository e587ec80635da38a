"""A real Ray cluster on loopback for the tests: a head node and worker nodes, each its own raylet with its
own CPUs, all in a temp dir of their own (RAY_TMPDIR), so that nothing touches another Ray on the machine
and every process it started can be found afterwards (they all carry that RAY_TMPDIR) and checked gone.

Nodes listen on 127.0.0.2: Ray rewrites 127.0.0.1 in an address into the machine's outward address, which
would take the traffic off loopback; any other 127.x is left alone and is loopback all the same.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

LOOPBACK = "127.0.0.2"
STORE_BYTES = 80 * 2**20


@dataclass
class LoopbackCluster:
    address: str
    temp_dir: str
    cluster: object

    def processes(self) -> list[int]:
        """Live processes of this cluster (any process whose environment names its temp dir), not us."""
        return processes_of(self.temp_dir)


def processes_of(temp_dir: str) -> list[int]:
    needle = f"RAY_TMPDIR={temp_dir}".encode()
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
                if state != "Z":
                    out.append(int(entry.name))
        except OSError:
            continue
    return out


@contextlib.contextmanager
def loopback_cluster(nodes: int = 3, cpus: int = 1) -> Iterator[LoopbackCluster]:
    """`nodes` Ray nodes (the first is the head) of `cpus` CPUs each; stopped, and checked stopped, after."""
    from ray.cluster_utils import Cluster

    temp_dir = tempfile.mkdtemp(prefix="llmc-ray-", dir="/tmp")  # short: Ray's socket paths must fit
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp_dir
    cluster = None
    try:
        args = {"num_cpus": cpus, "node_ip_address": LOOPBACK, "object_store_memory": STORE_BYTES}
        cluster = Cluster(initialize_head=True, head_node_args=args | {"include_dashboard": False})
        for _ in range(nodes - 1):
            cluster.add_node(**args)
        yield LoopbackCluster(cluster.address, temp_dir, cluster)
    finally:
        if cluster is not None:
            cluster.shutdown()
        left = _wait_gone(temp_dir, 10.0)
        for pid in left:  # ours, by their RAY_TMPDIR: never anyone else's
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(temp_dir, ignore_errors=True)
        assert not left, f"the Ray cluster left processes running: {left}"


def _wait_gone(temp_dir: str, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := processes_of(temp_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left
