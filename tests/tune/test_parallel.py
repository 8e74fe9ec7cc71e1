"""`tune --ray`'s decisions, pure (no process, no Ray): how many trials to ask at once within the budget, how many a
cluster can place, the port each lane's trial takes, the most trials that ran at once, and a resume after two
trials were cut short side by side. (The real cluster runs in test_tune_ray.py.)"""

from __future__ import annotations

import optuna
import pytest

from servedeck.campaign import cells as C
from servedeck.errors import ConfigError
from servedeck.tune import objective as O
from servedeck.tune.file import parse
from servedeck.tune.folder import most_at_once, render_markdown
from servedeck.tune.runner import TuneRun, crowded_nodes, ray_lanes, shared_hosts

from tests.tune.test_resume import TUNE


@pytest.mark.parametrize("finished,running,budget,parallel,spent,wall,want", [
    (0, 0, 8, 2, 0, None, 2),      # a start: both lanes
    (0, 1, 8, 2, 0, None, 1),      # one lane free
    (0, 2, 8, 2, 0, None, 0),      # none free
    (7, 0, 8, 2, 0, None, 1),      # one trial left in the budget
    (6, 1, 8, 2, 0, None, 1),      # the running one counts: one more
    (7, 1, 8, 2, 0, None, 0),      # the running one is the last
    (8, 0, 8, 4, 0, None, 0),      # spent
    (0, 0, 1, 4, 0, None, 1),      # a budget below the lanes bounds it
    (0, 0, None, 3, 10, 60, 3),    # a wall budget only
    (0, 1, None, 3, 60, 60, 0),    # wall spent: none more (the running one ends on its own)
])
def test_to_ask(finished, running, budget, parallel, spent, wall, want):
    assert O.to_ask(finished, running, budget, parallel, spent, wall) == want


def _node(cpu: float, gpu: float = 0, alive: bool = True) -> dict:
    res = {"CPU": cpu, "memory": 1e9} | ({"GPU": gpu} if gpu else {})
    return {"Alive": alive, "Resources": res, "NodeID": "x"}


def test_ray_lanes_counts_what_the_nodes_hold():
    head_no_cpu = _node(0)
    assert ray_lanes([head_no_cpu, _node(1), _node(1)], 1, 0) == 2  # the test cluster: two 1-CPU workers
    assert ray_lanes([_node(4), _node(2)], 2, 0) == 3
    assert ray_lanes([_node(16, 8), _node(16, 4)], 1, 2) == 6  # GPUs bound it
    assert ray_lanes([_node(16, 8)], 1, 3) == 2
    assert ray_lanes([_node(1), _node(1, alive=False)], 1, 0) == 1  # a dead node holds nothing
    assert ray_lanes([_node(0)], 1, 0) == 1  # at least one


def test_shared_hosts_names_a_host_with_several_task_nodes():
    def n(host: str, cpu: float = 1, alive: bool = True) -> dict:
        return _node(cpu, alive=alive) | {"NodeManagerHostname": host}
    assert shared_hosts([n("box", 0), n("box"), n("box")]) == ["box"]  # the tests' cluster: head (no CPU) + 2
    assert shared_hosts([n("box", 0), n("box"), n("other")]) == []
    assert shared_hosts([n("a"), n("a", alive=False), n("b")]) == []


def test_crowded_nodes_names_a_node_that_holds_several_cpu_trials():
    def n(host: str, cpu: float, gpu: float = 0) -> dict:
        return _node(cpu, gpu) | {"NodeManagerHostname": host, "NodeID": host * 8}
    assert crowded_nodes([n("a", 1), n("b", 1)], 1, 0) == []  # the tests' cluster: one trial a node
    assert crowded_nodes([n("big", 16)], 1, 0) == ["big " + ("big" * 8)[:12]]  # `--ray local` on 16 cores
    assert crowded_nodes([n("big", 16)], 8, 0) == ["big " + ("big" * 8)[:12]]
    assert crowded_nodes([n("big", 16)], 16, 0) == []
    assert crowded_nodes([n("gpu", 16, 8)], 1, 1) == []  # each trial its own GPU


def test_each_lane_takes_its_own_port(deck_config, tmp_path):
    tune = parse(TUNE, tmp_path / "search.toml")
    ports = []
    for lane in (0, 1, 2):
        camp = tune.trial_campaign(f"t{lane + 1}", {"args.parallel": 2}, lane)
        derived = C.derive(deck_config, camp)
        ports.append(derived.cfg.models[derived.models[f"t{lane + 1}"][0]].port)
        assert ("port_offset" in camp.text) == bool(lane)  # the node derives it again from this text
    assert len(set(ports)) == 3
    assert ports[0] == deck_config.models["smollm2"].port + 1 or ports[0] not in {
        m.port for m in deck_config.models.values()}


def test_a_tune_file_may_not_set_the_port_offset_itself(tmp_path):
    with pytest.raises(ConfigError, match="port_offset"):
        parse(TUNE.replace('model = "smollm2"', 'model = "smollm2"\nport_offset = 3'), tmp_path / "s.toml")


def test_search_parallel_is_read_and_checked(tmp_path):
    assert parse(TUNE.replace("seed = 0", "seed = 0\nparallel = 2"), tmp_path / "s.toml").space.parallel == 2
    assert parse(TUNE, tmp_path / "s.toml").space.parallel is None
    with pytest.raises(ConfigError, match="search.parallel"):
        parse(TUNE.replace("seed = 0", "seed = 0\nparallel = 0"), tmp_path / "s.toml")


def test_most_at_once():
    t = lambda a, b: {"started": f"2026-12-06T18:{a}+00:00", "ended": f"2026-12-06T18:{b}+00:00"}  # noqa: E731
    assert most_at_once([t("00:00", "01:00"), t("01:00", "02:00")]) == 1  # one ends as the next starts
    assert most_at_once([t("00:00", "02:00"), t("01:00", "03:00"), t("04:00", "05:00")]) == 2
    assert most_at_once([t("00:00", "05:00"), t("01:00", "02:00"), t("01:30", "03:00")]) == 3
    assert most_at_once([]) == 0


def test_tune_md_says_where_each_trial_ran(deck_config, tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    run = TuneRun(deck_config, parse(TUNE, tmp_path / "search.toml"), False)
    f = run.folder
    f.doc["ray"] = {"address": "127.0.0.1:6379", "parallel": 2, "nodes": ["n1", "n2"], "shared_hosts": ["box"]}
    for name, node, a, b in (("t1", "aaaaaaaaaaaaaaaa", "00:00", "02:00"), ("t2", "bbbbbbbbbbbbbbbb", "01:00", "03:00")):
        f.begin_trial(name, int(name[1]) - 1, {}, None)
        f.update_trial(name, state="done", ray_node_id=node, node="here", port=20001,
                       started=f"2026-12-06T18:{a}+00:00", ended=f"2026-12-06T18:{b}+00:00")
    md = render_markdown(f.doc)
    assert "## Where each trial ran" in md and "at most 2 trial(s) ran at the same time" in md
    assert "aaaaaaaaaaaa" in md and "bbbbbbbbbbbb" in md
    assert "Several nodes run on one host (box)" in md


def test_a_resume_redoes_both_trials_cut_short_side_by_side(deck_config, tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    first = TuneRun(deck_config, parse(TUNE, tmp_path / "search.toml"), False)
    study = first._study()
    f = first.folder
    f.begin_trial("starter", None, {}, None)
    f.update_trial("starter", state="done", verdict="measured", value=1.0, tell=None)
    a, b = study.ask(), study.ask()  # two at once, both running when the head was killed
    values = {"t1": first.tune.space.sample(a), "t2": first.tune.space.sample(b)}
    f.begin_trial("t1", a.number, values["t1"], None)
    f.begin_trial("t2", b.number, values["t2"], None)

    again = TuneRun(deck_config, parse(TUNE, tmp_path / "search.toml"), True)
    study = again._study()
    redo = again._recover(study)
    assert sorted(redo.values()) == ["t1", "t2"]
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states[a.number] == states[b.number] == optuna.trial.TrialState.FAIL
    asked = [again.tune.space.sample(study.ask()) for _ in range(2)]  # both asked again first, at once
    assert sorted(map(repr, asked)) == sorted(map(repr, values.values()))
    assert again._finished() == 0
