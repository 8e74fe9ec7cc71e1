"""What dispatch through Ray costs: the same two-cell llama.cpp campaign run locally (`--parallel`, each
variant pinned to one CPU) and through Ray (`--ray ADDRESS`, a head plus two worker nodes started on this
machine with ray.cluster_utils, one CPU each, each variant asking for its node with `host`), alternated,
`--rounds` times each. Timings: the whole `campaign run` (CLI start to exit) and each cell (campaign.json
started → ended). Medians are what to read; this machine is shared and noisy.

    .venv/bin/python bench/ray_overhead.py [--rounds 3] [--out bench/results/ray_overhead.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.campaign_matrix.test_matrix_llamacpp import models_toml  # noqa: E402  (the tests' models.toml)

CAMPAIGN = """
[campaign]
name = "NAME"
model = "smollm2"
cell_timeout = "4m"
gate = { context = 600, depths = [0.5] }

[[variants]]
name = "a"
host = "host_a"
cpus = [0]
args = { parallel = 1, threads = 1 }

[[variants]]
name = "b"
host = "host_b"
cpus = [1]
args = { parallel = 1, threads = 1 }

[[workloads]]
kind = "chat"
concurrency = [1]
input_tokens = 48
output_tokens = 16
requests = 4
warmup = 0
"""


def run(cfg: Path, camp: Path, env: dict[str, str], extra: list[str]) -> tuple[float, list[float]]:
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg), "campaign", "run", str(camp), *extra],
                       env=env, capture_output=True, text=True, timeout=600)
    wall = time.monotonic() - t0
    if r.returncode != 0:
        raise SystemExit(f"campaign run {' '.join(extra)} failed:\n{r.stderr[-3000:]}")
    folder = sorted((Path(env["SERVEDECK_RESULTS"]) / "campaigns").glob("*/campaign.json"), key=os.path.getmtime)[-1]
    cells = json.loads(folder.read_text())["cells"]
    return wall, [(datetime.fromisoformat(c["ended"]) - datetime.fromisoformat(c["started"])).total_seconds()
                  for c in cells]


def main() -> None:
    from ray.cluster_utils import Cluster

    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "bench/results"), "ray_overhead.json"))
    a = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="servedeck-ray-bench-"))
    cfg = models_toml(root)

    def node_env(n: str) -> dict[str, str]:
        return {"SERVEDECK_HOME": str(root / n / "home"), "SERVEDECK_RESULTS": str(root / n / "results")}

    t0 = time.monotonic()
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    c.add_node(num_cpus=1, resources={"host_a": 1}, env_vars=node_env("a"))
    c.add_node(num_cpus=1, resources={"host_b": 1}, env_vars=node_env("b"))
    c.wait_for_nodes()
    up = time.monotonic() - t0
    out: dict = {"cluster_up_s": up, "local": [], "ray": []}
    try:
        env = {**os.environ, **node_env("head"), "COLUMNS": "200"}
        for i in range(a.rounds):
            for mode in ("local", "ray"):
                camp = root / f"{mode}{i}.toml"
                camp.write_text(CAMPAIGN.replace("NAME", f"{mode}{i}"))
                extra = ["--parallel"] if mode == "local" else ["--ray", c.address]
                wall, cells = run(cfg, camp, env, extra)
                out[mode].append({"wall_s": wall, "cell_s": cells})
                print(f"round {i + 1} {mode}: {wall:.1f} s, cells {', '.join(f'{x:.1f}' for x in cells)}", flush=True)
    finally:
        c.shutdown()
    med = {m: (statistics.median(x["wall_s"] for x in out[m]),
               statistics.median(s for x in out[m] for s in x["cell_s"])) for m in ("local", "ray")}
    out["median"] = {m: {"wall_s": w, "cell_s": s} for m, (w, s) in med.items()}
    t = Table(title=f"`campaign run`, 2 cells side by side, {a.rounds} rounds (Ray cluster up in {up:.1f} s, not counted)")
    for col in ("mode", "wall p50 s", "cell p50 s", "walls"):
        t.add_column(col)
    for m in ("local", "ray"):
        t.add_row(m, f"{med[m][0]:.1f}", f"{med[m][1]:.1f}", ", ".join(f"{x['wall_s']:.1f}" for x in out[m]))
    t.add_row("ray − local", f"{med['ray'][0] - med['local'][0]:+.1f}", f"{med['ray'][1] - med['local'][1]:+.1f}", "")
    Console().print(t)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
