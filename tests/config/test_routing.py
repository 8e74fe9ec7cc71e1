"""models.toml's `routing` key: the front door's replica policy per model (docs/config.md, docs/door.md).
Refusals (an unknown policy, a knob the policy does not take) are in tests/data/bad_configs/routing_*."""

from __future__ import annotations

from servedeck.modelsfile import parse

HEAD = """
[builds.l]
engine = "llamacpp"
binary = "/bin/llama-server"
[models.smol]
source = "/m.gguf"
build = "l"
port = 8000
replicas = 2
"""


def test_routing_defaults_to_least_outstanding(tmp_path):
    cfg = parse(HEAD, tmp_path / "models.toml")
    assert cfg.models["smol.r1"].routing.policy == "least-outstanding"


def test_a_policy_name_alone_is_short_for_the_table(tmp_path):
    cfg = parse(HEAD + 'routing = "prefix"\n', tmp_path / "models.toml")
    assert cfg.models["smol.r2"].routing.policy == "prefix"


def test_every_replica_carries_its_entry_s_routing_table(tmp_path):
    cfg = parse(HEAD + 'routing = { policy = "session", header = "x-conv", imbalance = 2 }\n',
                tmp_path / "models.toml")
    r = cfg.models["smol.r2"].routing
    assert (r.policy, r.header, r.imbalance, r.prefix_chars) == ("session", "x-conv", 2, None)


def test_the_door_builds_each_model_s_policy_from_its_routing(tmp_path):
    from servedeck.door import policy as P
    from servedeck.door.manager import Manager
    from servedeck.door.metrics import DoorMetrics

    cfg = parse(HEAD + 'routing = { policy = "prefix", imbalance = 1 }\n'
                '[models.solo]\nsource = "/m.gguf"\nbuild = "l"\nport = 9000\n', tmp_path / "models.toml")
    m = Manager(cfg, DoorMetrics(gpu=False))
    assert isinstance(m.models["smol"].policy, P.Prefix) and m.models["smol"].policy.imbalance == 1
    assert isinstance(m.models["solo"].policy, P.LeastOutstanding)
