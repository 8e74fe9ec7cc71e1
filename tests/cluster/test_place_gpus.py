"""A Ray node's GPU grant → the cell's model entries on physical GPUs: a new derived configuration,
the one it was given left as it was (pure: no Ray, no process started)."""

from __future__ import annotations

import pytest

from servedeck.campaign.cells import cell_list, derive
from servedeck.campaign.file import parse
from servedeck.cluster.node import place_gpus
from servedeck.config.load import parse as parse_models
from servedeck.errors import ConfigError
from servedeck.init import render_starter

CAMPAIGN = """
[campaign]
name = "grant"
model = "smollm2"
cell_timeout = "10m"

[[variants]]
name = "b"
gpus = [1]

[[variants]]
name = "two"
replicas = 2

[[variants]]
name = "far"
gpus = [3]

[[workloads]]
kind = "chat"
concurrency = [1]
"""


@pytest.fixture
def campaign(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(render_starter())
    cfg = parse_models(path.read_text(), path)
    camp = parse(CAMPAIGN, tmp_path / "grant.toml")
    derived = derive(cfg, camp)
    return derived, {c.variant: c for c in cell_list(camp, derived)}


def test_a_named_position_becomes_the_granted_physical_gpu(campaign):
    derived, cells = campaign
    placed = place_gpus(derived, cells["b"], [4, 5])
    assert placed.cfg.models["smollm2@b"].gpus == [5]


def test_the_given_configuration_is_left_as_it_was(campaign):
    derived, cells = campaign
    place_gpus(derived, cells["b"], [4, 5])
    assert derived.cfg.models["smollm2@b"].gpus == [1]


def test_replicas_without_gpus_take_the_grant_in_order(campaign):
    derived, cells = campaign
    placed = place_gpus(derived, cells["two"], [6, 7])
    assert [placed.cfg.models[n].gpus for n in cells["two"].models] == [[6], [7]]


def test_no_grant_is_the_same_configuration(campaign):
    derived, cells = campaign
    assert place_gpus(derived, cells["two"], []) is derived


def test_a_position_beyond_the_grant_is_refused_naming_the_variant(campaign):
    derived, cells = campaign
    with pytest.raises(ConfigError, match=r"variants\.far\.gpus: position\(s\) \[3\]"):
        place_gpus(derived, cells["far"], [4, 5])
