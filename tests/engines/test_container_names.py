"""Every name servedeck gives docker or podman is one they accept (issue 31, item 6).

Docker and podman take container names matching [a-zA-Z0-9][a-zA-Z0-9_.-]+ only ("names must match
[a-zA-Z0-9][a-zA-Z0-9_.-]*", podman 4.3), and seed 000's campaign cells were named
`servedeck-qwen38_27b@tp4`: every cell of an `image` build failed. Here: every model of a models.toml with
an image build (replicas, odd characters) and every cell of a campaign over it (`@` variants, matrix
variants with `=` and `,`), through the argv `start` renders and the `rm -f` the deck sends.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servedeck.campaign.cells import derive
from servedeck.campaign.file import parse as parse_campaign
from servedeck.config.load import parse as parse_models
from servedeck.deck import Deck
from servedeck.deck import docker as D
from servedeck.deck.records import LiveRecord

DOCKER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]+")

MODELS = """
[builds.stock]
engine = "vllm"
image = "vllm/vllm-openai:v0.31.0"

[builds.podman]
engine = "llamacpp"
image = "ghcr.io/ggml-org/llama.cpp:server"
docker = "podman"

[models.qwen38_27b]
source = "/mnt/data/models/Qwen__Qwen3.8-27B-FP8"
build = "stock"
port = 8000
tp = 4

[models.dp4]
source = "/mnt/data/models/Qwen__Qwen3.8-27B-FP8"
build = "stock"
port = 8100
slot = "dp4"
replicas = 4

[models."Qwen3.8-27B:fp8,mtp"]
source = "Qwen/Qwen3.8-27B-FP8"
build = "stock"
port = 8200
slot = "odd"

[models."model+x@y=1"]
source = "/m/u.gguf"
build = "podman"
port = 8300
slot = "odd2"

[models."a@b"]
source = "/m/a.gguf"
build = "podman"
port = 8400
slot = "ab1"

[models."a+b"]
source = "/m/a.gguf"
build = "podman"
port = 8401
slot = "ab2"

"""
# Names models.toml refuses (a space, '/', a leading '-' or '@', non-ASCII: tests/deck's name tests) never
# reach docker; the ones above are valid model names docker would still refuse (':', ',', '+', '@', '=').

CAMPAIGN = """
[campaign]
name = "qwen38-1m"
model = "qwen38_27b"

[[variants]]
name = "tp4"

[[variants]]
name = "mtp"
args = { speculative-config = { method = "mtp", num_speculative_tokens = 3 } }

[[variants]]
name = "dp4_a"
dp = 4
tp = 1
replicas = 2
gpus = [[0, 1, 2, 3], [4, 5, 6, 7]]

[matrix]
"args.max-num-batched-tokens" = [8192, 32768]
"env.VLLM_USE_DEEP_GEMM" = ["0"]

[[workloads]]
kind = "chat"
concurrency = [1]
input_tokens = 64
output_tokens = 8
requests = 1
"""


def names_given(cfg) -> dict[str, str]:
    """model → the container name its `start` argv hands to docker/podman (`--name X`)."""
    out = {}
    for m in cfg.models:
        argv = Deck(cfg).render(m).argv
        out[m] = argv[argv.index("--name") + 1]
    return out


@pytest.fixture
def cfg():
    return parse_models(MODELS, Path("/x/models.toml"))


def test_every_container_name_is_one_docker_accepts_and_each_model_has_its_own(cfg):
    derived = derive(cfg, parse_campaign(CAMPAIGN, Path("/x/campaign.toml")))
    names = names_given(derived.cfg)
    assert "qwen38_27b@tp4" in names and "dp4.r4" in names and "qwen38_27b@dp4_a.r2" in names
    assert any("=" in m and "," in m for m in names)  # a matrix variant: `max-num-batched-tokens=8192,...`
    bad = {m: n for m, n in names.items() if not DOCKER_NAME.fullmatch(n)}
    assert not bad, bad
    assert len(set(names.values())) == len(names), "two models share a container name"
    assert names["a@b"] != names["a+b"]  # the same once cleaned, apart by their hash


def test_the_name_reads_as_the_model_and_is_stable(cfg):
    names = names_given(cfg)
    assert re.fullmatch(r"servedeck-qwen38_27b-[0-9a-f]{8}", names["qwen38_27b"])
    assert re.fullmatch(r"servedeck-Qwen3.8-27B-fp8-mtp-[0-9a-f]{8}", names["Qwen3.8-27B:fp8,mtp"])
    assert re.fullmatch(r"servedeck-model-x-y-1-[0-9a-f]{8}", names["model+x@y=1"])
    assert names == names_given(cfg)  # rendered again (cmd.sh, the unit, a restart): the same name


def test_another_servedeck_home_gets_other_container_names(cfg, monkeypatch, tmp_path):
    """One docker daemon, two homes (two users, two test runs): `rm -f` of one must not end the other's."""
    mine = names_given(cfg)
    monkeypatch.setenv("SERVEDECK_HOME", str(tmp_path / "other-home"))
    theirs = names_given(cfg)
    assert not set(mine.values()) & set(theirs.values())


def test_the_deck_removes_the_container_the_launch_was_given(cfg, monkeypatch):
    sent = []
    monkeypatch.setattr(D.subprocess, "run", lambda argv, **kw: sent.append(argv))
    for model in ("model+x@y=1", "qwen38_27b"):
        spec = Deck(cfg).render(model)
        build = cfg.deck.builds[cfg.models[model].build]
        rec = LiveRecord(model=model, engine=spec.engine, build="b", slot=spec.slot, port=spec.port, launch_dir="/x",
                         pid=1, pgid=1, create_time=0.0, owner_pid=1, image=build.image, docker=build.docker,
                         spec=spec.to_json())
        D.remove_container(rec)
        assert sent[-1] == [build.docker, "rm", "-f", spec.argv[spec.argv.index("--name") + 1]]
        assert DOCKER_NAME.fullmatch(sent[-1][-1])


def test_podman_gets_no_shm_size_beside_host_ipc(cfg):
    """podman 4.3 refuses `--shm-size` with `--ipc=host` (seen here: "cannot set shmsize when running in the
    {host } IPC Namespace"); docker takes both, as the seed's cmd.sh writes them."""
    podman = Deck(cfg).render("a@b").argv
    docker = Deck(cfg).render("qwen38_27b").argv
    assert podman[0] == "podman" and "--ipc=host" in podman and not any(a.startswith("--shm-size") for a in podman)
    assert "--shm-size=64g" in docker and "--ipc=host" in docker
