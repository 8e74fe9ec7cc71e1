"""One campaign cell in a real container (issue 31, item 6): podman runs llama-server from an image.

`docker` on this machine is a client with no daemon; Debian's podman (4.3) runs containers here once two
things of this sandbox are worked around in a containers.conf of the test's own (CONTAINERS_CONF, nothing
system-wide): crun refuses the host's hybrid cgroup mounts (runc takes them), and without
CAP_SYS_RESOURCE podman's default ulimits cannot be set (lowered to this process's own). The image is
built here from the llama-server binary setup.sh made and the libraries it links (`podman import` of that
root: no registry). The cell's model name carries the campaign's `@`, which docker and podman refuse in a
container name: before the fix the cell failed at `podman run`. Skipped where podman cannot run a container.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import pytest

from ports import free_port

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp, pytest.mark.slow]

IMAGE = "localhost/servedeck-test-llama-server:forensics"

CAMPAIGN = """
[campaign]
name = "t-box"
model = "smollm2"
cell_timeout = "5m"
gate = { context = 600, depths = [0.5] }

[[variants]]
name = "in-a-box"
args = { parallel = 1, threads = 2 }

[[workloads]]
kind = "chat"
concurrency = [1]
input_tokens = 48
output_tokens = 8
requests = 2
warmup = 0
"""


def _conf(folder: Path) -> Path:
    soft_nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    soft_nproc = resource.getrlimit(resource.RLIMIT_NPROC)[0]
    lines = ["[containers]", f'default_ulimits = ["nofile={soft_nofile}:{soft_nofile}", '
                             f'"nproc={min(soft_nproc, 4096)}:{min(soft_nproc, 4096)}"]']
    if shutil.which("runc"):
        lines += ["[engine]", 'runtime = "runc"']
    path = folder / "containers.conf"
    path.write_text("\n".join(lines) + "\n")
    return path


def _rootfs_tar(binary: Path, out: Path) -> None:
    """llama-server, the VERSION file beside it, and every library `ldd` says it links."""
    libs = [Path(p) for ln in subprocess.run(["ldd", str(binary)], capture_output=True, text=True).stdout.splitlines()
            for p in ln.split() if p.startswith("/")]
    with tarfile.open(out, "w") as tar:
        tar.add(binary, "usr/local/bin/llama-server")
        if binary.with_name("VERSION").exists():
            tar.add(binary.with_name("VERSION"), "usr/local/bin/VERSION")
        for lib in libs:
            tar.add(lib.resolve(), str(lib).lstrip("/"))
        for d in ("tmp", "root"):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777
            tar.addfile(info)


@pytest.fixture(scope="module")
def podman_image(tmp_path_factory, engines_ready):
    if not shutil.which("podman"):
        pytest.skip("podman is not installed here (`apt-get install podman runc`)")
    folder = tmp_path_factory.mktemp("podman")
    conf = _conf(folder)
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    binary = Path(engines_ready["llama_server"])
    _rootfs_tar(binary, folder / "root.tar")
    made = subprocess.run(["podman", "import", "--change", 'ENTRYPOINT ["/usr/local/bin/llama-server"]',
                           str(folder / "root.tar"), IMAGE], capture_output=True, text=True, env=env, timeout=300)
    if made.returncode != 0:
        pytest.skip(f"podman cannot import an image here: {made.stderr.strip()[-300:]}")
    trial = subprocess.run(["podman", "run", "--rm", IMAGE, "--version"], capture_output=True, text=True, env=env,
                           timeout=120)
    if trial.returncode != 0:
        pytest.skip(f"podman cannot run a container here: {trial.stderr.strip()[-300:]}")
    yield {"conf": conf, "env": env}
    subprocess.run(["podman", "rmi", "-f", IMAGE], capture_output=True, env=env, timeout=120)


def test_a_campaign_cell_runs_in_a_podman_container(podman_image, tmp_path, servedeck_home):
    from servedeck.init import default_locations

    loc = default_locations()
    home, results, hf = servedeck_home, tmp_path / "results", tmp_path / "hf"
    hf.mkdir()  # docker creates a missing bind-mount source, podman refuses it: the HF cache mount needs one
    base = free_port()
    models = tmp_path / "models.toml"
    models.write_text(f"""
[builds.box]
engine = "llamacpp"
image = "{IMAGE}"
docker = "podman"

[models.smollm2]
source = "{loc['smollm2_gguf']}"
build = "box"
port = {base}
context = 2048
args = {{ parallel = 1 }}
""")
    camp = tmp_path / "camp.toml"
    camp.write_text(CAMPAIGN)
    env = {**podman_image["env"], "SERVEDECK_HOME": str(home), "SERVEDECK_RESULTS": str(results), "HF_HOME": str(hf),
           "COLUMNS": "200"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(models), "campaign", "run", str(camp),
                        "--json"], capture_output=True, text=True, env=env, timeout=600)
    took = time.monotonic() - t0
    doc = json.loads(next((results / "campaigns").glob("*/campaign.json")).read_text())
    [cell] = doc["cells"]
    assert cell["state"] == "done", (cell.get("reason"), r.stderr[-3000:])
    assert r.returncode == 0, r.stderr[-2000:]
    [launch] = list((home / "launches" / "smollm2@in-a-box").iterdir())
    cmd = (launch / "cmd.sh").read_text()
    assert "exec podman \\\n  run" in cmd and "--name servedeck-smollm2-in-a-box-" in cmd, cmd
    left = subprocess.run(["podman", "ps", "-a", "--format", "{{.Names}}"], capture_output=True, text=True,
                          env=env, timeout=60).stdout.split()
    assert not [n for n in left if n.startswith("servedeck-smollm2-in-a-box-")], left  # stopped and removed
    print(f"container cell: {took:.1f} s, runs {cell['runs']}")
