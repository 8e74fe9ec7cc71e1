"""`servedeck hosts`: every alive node of the Ray cluster, asked by a task pinned to it."""

from __future__ import annotations

from typing import Any, Optional

from servedeck.cluster import node as N


def hosts(models_toml: Optional[str], models_path: Optional[str], model: Optional[str] = None,
          timeout_s: float = 300.0) -> list[dict[str, Any]]:
    """One row per alive node: host, Ray node id, CPUs, GPUs (name, memory free), servedeck version and
    the doctor's verdict for `model` (every model when None) when a models.toml is given. Call
    inside cluster.connect.connected()."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    task = ray.remote(num_cpus=0, max_retries=0)(N.facts)
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    refs = [(n, task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
             .remote(models_toml, models_path, model)) for n in nodes]
    out = []
    for n, ref in refs:
        res = n.get("Resources") or {}
        custom = sorted(k for k in res if not k.startswith(("node:", "CPU", "GPU", "memory", "object_store"))
                        and k != "accelerator_type" and not k.startswith("accelerator_type:"))
        row: dict[str, Any] = {"ray_node_id": n["NodeID"], "address": n.get("NodeManagerAddress"),
                               "host": n.get("NodeManagerHostname"), "head": "node:__internal_head__" in res,
                               "ray_cpus": res.get("CPU", 0), "ray_gpus": res.get("GPU", 0), "resources": custom,
                               "labels": {k: v for k, v in (n.get("Labels") or {}).items() if not k.startswith("ray.io/")}}
        try:
            row.update(ray.get(ref, timeout=timeout_s))
        except Exception as e:
            row.update(doctor="unreachable", error=f"{type(e).__name__}: {str(e).splitlines()[0][:300]}")
        out.append(row)
    return out
