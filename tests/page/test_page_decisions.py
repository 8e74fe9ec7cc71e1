"""The page's pure decisions, without processes: when a figure is stale, what changed in an entry, which
`why` entry sits beside which flag, when a campaign variant lost, whose fault a crash was, and how a
state this servedeck does not name is shown."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from servedeck.errors import ConfigError
from servedeck.modelsfile import parse
from servedeck.page.history import crash_rows
from servedeck.page.stale import basis, mark, why_text
from servedeck.page.today import _why_rows, entry_changes, is_running
from servedeck.page.tried import better, worse

ARGV = ["/b/llama-server", "-m", "/m.gguf", "--host", "127.0.0.1", "--port", "8081", "--parallel", "2",
        "--threads", "2", "--metrics"]


def b(**kw):
    base = dict(build="next", build_path="/b/llama-server", engine_version="v2", argv=ARGV, env={}, context=1024,
                engine="llamacpp")
    return basis(**{**base, **kw})


def test_the_same_launch_holds():
    assert mark(b(), b()) == {"stale": False, "why": [], "unknown": []}


def test_a_port_is_where_it_listened_not_what_was_measured():
    moved = [*ARGV]
    moved[moved.index("8081")] = "9000"
    assert mark(b(argv=moved), b())["stale"] is False


@pytest.mark.parametrize("then,what,changes", [
    (dict(build="stock"), "build", None),
    (dict(engine_version="v1"), "engine version", None),
    (dict(context=2048), "context", None),
    (dict(argv=[*ARGV[:-2], "1", "--metrics"]), "rendered argv", ["--threads: 1 → 2"]),
    (dict(argv=ARGV + ["--flash-attn"]), "rendered argv", ["--flash-attn: on → (absent)"]),
    (dict(env={"HF_HUB_OFFLINE": "1"}), "environment", ["HF_HUB_OFFLINE: 1 → (absent)"]),
])
def test_each_change_marks_a_figure_stale_and_says_what(then, what, changes):
    m = mark(b(**then), b())
    assert m["stale"] and [r["what"] for r in m["why"]] == [what]
    assert m["why"][0].get("changes") == changes
    assert why_text(m).startswith(f"stale: {what}")


def test_what_an_old_record_does_not_say_is_unknown_not_stale():
    m = mark(b(engine_version=None, argv=None), b())
    assert m == {"stale": False, "why": [], "unknown": ["engine version", "launch argv"]}


def test_a_campaign_variant_goes_stale_only_by_build_version_or_context():
    m = mark(b(argv=ARGV + ["--ubatch-size", "1"], engine_version="v1"), b(), launch=False)
    assert [r["what"] for r in m["why"]] == ["engine version"]


def test_entry_changes_are_dotted_keys_with_both_values():
    then = {"model": {"args": {"threads": 2, "parallel": 2}, "notes": "a", "why": {}}, "build_name": "stock"}
    now = {"model": {"args": {"threads": 1, "parallel": 2}, "notes": "a", "why": {"threads": "x"}},
           "build_name": "next"}
    assert entry_changes(then, now) == [
        {"key": "model.args.threads", "then": 2, "now": 1},
        {"key": "model.why", "then": {}, "now": "(absent)"},
        {"key": "build_name", "then": "stock", "now": "next"},
        {"key": "model.why.threads", "then": "(absent)", "now": "x"}]


TOML = """
[builds.b]
engine = "vllm"
python = "/nonexistent/bin/python"

[models.m]
source = "org/model"
build = "b"
port = 8000
gpu_memory_utilization = 0.95
args = { max_num_seqs = 16 }
env = { HF_HUB_OFFLINE = "1" }
why = { "--kv-cache-dtype" = "on anyway: the checkpoint declares fp8 KV", max_num_seqs = "the engine's cap", HF_HUB_OFFLINE = "the cache holds the snapshot", gpu_memory_utilization = "a requirement, pinned" }
"""


def test_why_sits_beside_its_flag_env_or_key_or_beside_its_absence(tmp_path):
    cfg = parse(TOML, tmp_path / "models.toml")
    flags = {"--max-num-seqs": "16", "--gpu-memory-utilization": "0.95"}
    rows = {r["key"]: r for r in _why_rows(cfg, "m", flags, {"HF_HUB_OFFLINE": "1"})}
    assert rows["kv-cache-dtype"] == {"key": "kv-cache-dtype", "reason": "on anyway: the checkpoint declares fp8 KV",
                                      "present": False, "where": None}
    assert rows["max_num_seqs"]["where"] == "--max-num-seqs 16"
    assert rows["HF_HUB_OFFLINE"]["where"] == "env HF_HUB_OFFLINE=1"
    assert rows["gpu_memory_utilization"]["where"] == "--gpu-memory-utilization 0.95"


@pytest.mark.parametrize("why,words", [
    ('{ "" = "x" }', "names nothing"),
    ('{ threads = "  " }', "the reason is empty"),
    ('{ threads = "a", "--threads" = "b" }', "name the same flag"),
])
def test_a_bad_why_entry_is_refused_naming_it(tmp_path, why, words):
    text = TOML.replace(TOML[TOML.index("why = {"):TOML.index("}\n", TOML.index("why = {")) + 1], f"why = {why}")
    with pytest.raises(ConfigError) as e:
        parse(text, tmp_path / "models.toml")
    assert words in e.value.message and "why" in e.value.message


def V(figure, change, distinguishable=True):
    return SimpleNamespace(figure=figure, change=change, distinguishable=distinguishable)


def test_a_variant_loses_when_a_figure_is_worse_by_a_real_margin():
    assert worse(V("TTFT p50", 2.5)) and not better(V("TTFT p50", 2.5))
    assert worse(V("output tok/s per host", -0.4)) and better(V("output tok/s per host", 0.4))
    assert not worse(V("TTFT p50", 2.5, distinguishable=False))  # within noise: not a loss
    assert better(V("TPOT p50", -0.3))


def crash(cause: dict) -> dict:
    return {"ts": "2026-09-12T14:25:46+00:00", "event": "crash", "outcome": "crashed", "model": "m",
            "launch_dir": "/nowhere", "cause": cause, "detail": "exited with code 1"}


def test_a_node_event_is_the_hosts_fault_and_another_process_xid_is_not_this_models():
    xid79 = {"id": "xid-79", "family": "gpu-lost", "severity": "node", "summary": "Xid 79: GPU has fallen off the bus",
             "action": "reboot the node; check the host power path", "kernel": [
                 {"kind": "xid", "code": 79, "pid": None, "pci": "PCI:0000:01:00", "ours": True, "whose": "this model's: on its GPU"},
                 {"kind": "xid", "code": 31, "pid": 4242, "pci": "PCI:0000:01:00", "ours": False,
                  "whose": "not this model's: pid 4242 (python) was another process"}]}
    [row] = crash_rows([crash(xid79)], {}, lambda la: (None, None))
    assert row["not_its_fault"] and "the host's fault, not this model's" in row["fault_note"]
    assert [(k["code"], k["ours"], k["whose"].split(":")[0]) for k in row["kernel"]] == \
        [(79, True, "this model's"), (31, False, "not this model's")]
    # records written before kernel events were matched to processes: said so, not guessed
    [old] = crash_rows([crash({"id": "xid-31", "family": "cuda-fault", "severity": "app",
                               "kernel": [{"code": 31, "pid": 7}]})], {}, lambda la: (None, None))
    assert not old["not_its_fault"] and old["kernel"][0]["whose"] == "matched by time only"
    assert crash_rows([crash({"id": "x"})], {}, lambda la: (None, None))[0]["build"] is None  # nothing to read it from


def test_a_build_and_version_on_the_crash_record_win_over_the_launch_folder():
    r = {**crash({"id": "segfault"}), "build": "stock", "engine_version": "0.29.0"}
    [row] = crash_rows([r], {}, lambda la: ("never", "asked"))
    assert (row["build"], row["engine_version"], row["engine_version_from"]) == ("stock", "0.29.0", "the crash record")


@pytest.mark.parametrize("row,running", [
    ({"state": "ready", "pid": 10}, True),
    ({"state": "asleep", "pid": 10}, True),  # a state a newer deck names (vLLM's sleep mode): its process runs
    ({"state": "crashed", "pid": 10}, False),  # found ended: shown once, with the pid it had
    ({"state": "absent", "pid": None}, False),
    (None, False),
])
def test_a_state_this_servedeck_does_not_name_is_shown_as_it_is(row, running):
    assert is_running(row) is running


H200 = Path(__file__).resolve().parents[2] / "docs/gpu-runs/campaign-h200-cache-ram-2026-12-01/results/campaigns"


def test_a_recorded_h200_campaign_lists_its_refuted_variants_and_says_the_base_is_not_a_result():
    """The campaign run on an H200 (2026-12-01, random 8B-shape weights: every gate failed). The page lists
    both variants as failed their gate, keeps what they lost on (parallel 8 at 32 users: TTFT 418 % slower),
    and a comparison against a base whose own gate failed is not called a result."""
    from servedeck.page.stale import Basis
    from servedeck.page.tried import tried

    t = tried(sorted(H200.iterdir()), Basis())
    [camp] = t["campaigns"]
    assert (camp["name"], camp["base_variant"], camp["base_gate"]) == ("h200-cache-ram", "default", ["failed"])
    refuted = {r["variant"]: r for r in t["refuted"]}
    assert {v: r["verdict"] for v, r in refuted.items()} == {"cache-ram0": "failed its gate", "p8": "failed its gate"}
    assert refuted["p8"]["knobs"] == "args.parallel=8"
    assert any(x.startswith("c=32 TTFT p50: 874.0 ms (base) against 4,528.5 ms — B is 418 % slower")
               for x in refuted["p8"]["lost"]), refuted["p8"]["lost"]


def test_a_variant_that_only_lost_against_a_failed_base_is_no_result(tmp_path):
    """The same campaign with the variants' gate records set aside: they would have 'lost' and 'won', but
    against a base whose gate failed; the page says no comparison, and why."""
    import shutil

    from servedeck.page.stale import Basis
    from servedeck.page.tried import tried

    root = tmp_path / "results"
    shutil.copytree(H200.parent, root)
    for run in (root / "runs").iterdir():
        if "__default__" not in run.name and (run / "niah.log").exists():
            (run / "niah.log").unlink()  # the variant's own gate evidence gone: its gate reads "not run"
            s = json.loads((run / "summary.json").read_text())
            s["gate"] = {"status": "not run"}
            (run / "summary.json").write_text(json.dumps(s))
    [camp] = tried(sorted((root / "campaigns").iterdir()), Basis())["campaigns"]
    p8 = next(v for v in camp["variants"] if v["variant"] == "p8")
    assert p8["verdict"] == "no comparison" and not p8["refuted"] and p8["lost"]
    assert "the base variant's gate: failed; a comparison with it is not a result" in p8["reasons"]


def test_the_command_refuses_two_forms_and_names_an_unknown_model(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    from servedeck.cli import root_app as app
    from servedeck.errors import UnknownModelError, UsageError

    (tmp_path / "models.toml").write_text(TOML)
    monkeypatch.setenv("SERVEDECK_CONFIG", str(tmp_path / "models.toml"))
    r = CliRunner().invoke(app, ["page", "m", "--md", "--json"])
    assert isinstance(r.exception, UsageError) and "--md and --json each choose the whole output" in r.exception.message
    r = CliRunner().invoke(app, ["page", "nope"])
    assert isinstance(r.exception, UnknownModelError) and "no model or alias named 'nope'" in r.exception.message


def test_a_secret_never_reaches_the_page(tmp_path, monkeypatch):
    """A token in the model's env and an api key in its args: rendered redacted, and found nowhere in the
    document, the Markdown or the HTML (a page is meant to be pasted and shared)."""
    from servedeck.page import build_page, to_html, to_markdown

    secret = "hf_SECRETvalue0123456789"
    text = TOML.replace('env = { HF_HUB_OFFLINE = "1" }', f'env = {{ HF_HUB_OFFLINE = "1", HF_TOKEN = "{secret}" }}')
    text = text.replace("args = { max_num_seqs = 16 }", 'args = { max_num_seqs = 16, api-key = "sk-verysecretkey0123456789" }')
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    doc = build_page(parse(text, tmp_path / "models.toml"), "m")
    assert doc["history"] is False and doc["sections"]["launch"]["env"]["HF_TOKEN"] == "<redacted>"
    for out in (json.dumps(doc), to_markdown(doc), to_html(doc)):
        assert secret not in out and "sk-verysecretkey0123456789" not in out
    assert "--api-key" in doc["sections"]["launch"]["argv"]


def test_two_runs_stamped_in_one_second_are_ordered_by_the_folder_made_later():
    """A gate and the bench after it often start in one second: the bench's folder is fsio.unique_dir's
    `STAMP-2`. Newest first puts it before the gate's, whatever order the folders were read in (CI once saw
    the gate first when the two ties were left to the read order)."""
    from servedeck.page.history import newest_first_key

    at = "2026-12-03T17:20:04+00:00"
    gate = {"path": "/r/runs/smol__tp1__512__llamacpp__1203-172004", "at": at}
    bench = {"path": "/r/runs/smol__tp1__512__llamacpp__1203-172004-2", "at": at}
    third = {"path": "/r/runs/smol__tp1__512__llamacpp__1203-172004-10", "at": at}
    later = {"path": "/r/runs/smol__tp1__512__llamacpp__1203-172005", "at": "2026-12-03T17:20:05+00:00"}
    for order in ([gate, bench, third, later], [later, third, bench, gate], [bench, later, gate, third]):
        assert sorted(order, key=newest_first_key, reverse=True) == [later, third, bench, gate]
