"""`compare run --ray [ADDRESS]`: the same run, with Ray doing the work that one host cannot.

- Split load (default): every load point is sent by `--ray-actors` load generators spread over the
  cluster's nodes (`workloads.distributed`); servers are launched (or reached) as without Ray, and the
  records stream into this run directory as they arrive.
- Cells (`--ray-cells`): every backend x variant x load point is a Ray task with its own resource request,
  which launches, warms up, loads and stops its server on the node it was given
  (`compare.measure.ray_matrix`).

The manifest's `ray` entry says where everything ran: the cluster, each actor's node and process, and per
load point each actor's share, clock offset (before and after) and what it began, finished and lost.
Ray is shut down (this process's connection, the actors, the placement group, and a cluster we started
ourselves) on every way out.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from compare.measure.loop import measure
from compare.measure.watcher import Watcher
from compare.plan.run_options import RunPlan

if TYPE_CHECKING:
    from compare.measure.run_dir import RunDir

LOCAL = "local"
OBJECT_STORE_BYTES = 128 * 2**20  # a local instance: records are small, keep the shared memory small


@contextlib.contextmanager
def ray_session(address: str, num_cpus: int | None = None) -> Iterator[dict[str, Any]]:
    """Connect to the cluster at `address` (`local`: start one on this host, loopback only, no dashboard,
    `num_cpus` CPUs); yield what the manifest says about it; always disconnect (and stop a local one)."""
    import ray

    kwargs: dict[str, Any] = {"namespace": "llm-compare", "logging_level": logging.WARNING}
    if address == LOCAL:
        kwargs |= {
            "num_cpus": num_cpus,
            "object_store_memory": OBJECT_STORE_BYTES,
            "include_dashboard": False,
            "_node_ip_address": "127.0.0.1",
        }
    else:
        kwargs["address"] = address
        host = address.removeprefix("ray://").rsplit(":", 1)[0]
        if host.startswith("127."):  # a cluster on this machine's loopback: join it there
            kwargs["_node_ip_address"] = host
    on_sigterm = signal.getsignal(signal.SIGTERM)
    ray.init(**kwargs)
    with contextlib.suppress(ValueError, TypeError):  # not the main thread, or no Python handler to put back
        # ray.init makes SIGTERM exit at once; the run's handler stops it as Ctrl-C does (partial report)
        signal.signal(signal.SIGTERM, on_sigterm)
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive")]
        yield {
            "address": address,
            "ray_version": ray.__version__,
            "nodes": [
                {
                    "node_id": n["NodeID"],
                    "node_ip": n.get("NodeManagerAddress"),
                    "hostname": n.get("NodeManagerHostname"),
                    "resources": n.get("Resources", {}),
                }
                for n in nodes
            ],
            "points": {},
            "notes": [],
        }
    finally:
        ray.shutdown()


def measure_on_ray(plan: RunPlan, run_dir: RunDir, watcher: Watcher) -> int:
    """Measure `plan` on Ray: the ordinary measuring loop with the load of every point split over load
    generators on the cluster, or every cell a Ray task; the exit code."""
    say = watcher.say
    if plan.ray is None:
        raise ValueError("measure_on_ray: the plan names no Ray cluster (--ray)")
    with ray_session(plan.ray, plan.ray_actors or 2) as info:
        run_dir.manifest["ray"] = info
        run_dir.save()
        say(f"ray: {len(info['nodes'])} node(s) at {plan.ray} (ray {info['ray_version']})")
        if plan.ray_cells:
            from compare.measure.ray_matrix import run_cells

            info["mode"] = "cells"
            return run_cells(plan, run_dir, say)
        return _split(plan, run_dir, watcher, info)


def _split(plan: RunPlan, run_dir: RunDir, watcher: Watcher, info: dict[str, Any]) -> int:
    from workloads.distributed import LoadGenerators, RayLoad, default_generators

    say = watcher.say
    info["mode"] = "split"
    count = plan.ray_actors or (2 if plan.ray == LOCAL else default_generators())
    generators = LoadGenerators(count, cpus=plan.ray_actor_cpus)
    try:
        info["generators"] = generators.placement()
        run_dir.save()
        nodes = len({g["node_id"] for g in info["generators"]})
        say(f"ray: {count} load generator(s) on {nodes} node(s)")

        def on_point(run_id: str, placement: dict[str, Any]) -> None:
            info["points"][run_id] = placement
            for g in placement["generators"]:
                if g["died"]:
                    note = (
                        f"load generator {g['slot']} ({g['node_ip']}, pid {g['pid']}) died during point "
                        f"{run_id}: {g['lost']} requests in flight recorded as failed (client_lost)"
                        + (f", {g['never_sent']} of its share never sent" if g["never_sent"] else "")
                        + f"; {g['died']}"
                    )
                    run_dir.manifest["notes"].append(note)
                    say(f"[yellow]warning:[/yellow] {note}")
            run_dir.save()

        return measure(plan, run_dir, watcher, RayLoad(generators, on_point))
    finally:
        generators.shutdown()
        info["notes"] += generators.notes
        run_dir.manifest["notes"] += generators.notes
        info["generators"] = generators.placement()  # replacements included
        run_dir.save()
