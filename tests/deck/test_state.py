"""desired.json: atomic, versioned, migrated, and a corrupt file is an error that names it."""

from __future__ import annotations

import json

import pytest

from servedeck import paths
from servedeck.deck import state as S
from servedeck.errors import StateError


def test_write_keeps_previous_good_copy():
    S.set_desired("a", {"x": 1})
    S.set_desired("b", {"x": 2})
    bak = paths.desired_file().with_suffix(".json.bak")
    assert json.loads(bak.read_text())["models"] == {"a": {"x": 1}}
    assert S.read_desired()["models"] == {"a": {"x": 1}, "b": {"x": 2}}


def test_corrupt_desired_is_named_and_backup_kept():
    S.set_desired("a", {"x": 1})
    S.set_desired("b", {"x": 2})
    paths.desired_file().write_text('{"schema": 1, "models": {"a": ')  # truncated mid-write by something else
    with pytest.raises(StateError) as e:
        S.read_desired()
    assert str(paths.desired_file()) in e.value.message and "nothing was started" in e.value.message
    assert "desired.json.bak" in e.value.hint
    with pytest.raises(StateError):
        S.set_desired("c", {})  # never overwrite what we could not read
    assert json.loads(paths.desired_file().with_suffix(".json.bak").read_text())["models"] == {"a": {"x": 1}}


def test_unversioned_file_is_migrated_by_name():
    paths.desired_file().write_text(json.dumps({"a": {"x": 1}}))
    doc = S.read_desired()
    assert doc["schema"] == 1 and doc["models"] == {"a": {"x": 1}} and doc["migrations"] == ["wrap_models_v1"]


def test_newer_schema_refused():
    paths.desired_file().write_text(json.dumps({"schema": 99, "models": {}}))
    with pytest.raises(StateError, match="newer"):
        S.read_desired()


def test_slot_decisions_are_pure():
    from servedeck.deck.slots import Running, decide

    run = [Running("flash", "main", 8000), Running("embed", "aux", 8001)]
    assert decide("qwen", "main", run).holders == ("flash",)
    assert decide("qwen", "main", run).start is False
    assert decide("tiny", "spare", run).start is True
    assert decide("flash", "main", run).already_running is True
