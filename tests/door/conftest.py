"""One door, booted once per module on real llama-server engines, shared by the tests of the module.

The root conftest gives every test its own SERVEDECK_HOME and stops its engines after it; a shared
door needs one home for the whole module, so `servedeck_home` is overridden here: the module's home
stays put, and its engines are stopped (by process group) when the module ends."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from servedeck.modelsfile import load
from servedeck.door import ServeOptions

sys.path.insert(0, str(Path(__file__).parent))  # doorkit.py and cdp.py live beside this file

from doorkit import SESSION, TEST_MARK, DoorThread, door_config, stop_everything  # noqa: E402


@pytest.fixture(scope="module")
def door_home(tmp_path_factory):
    home = tmp_path_factory.mktemp("door-home")
    mp = pytest.MonkeyPatch()
    mp.setenv("SERVEDECK_HOME", str(home))
    mp.setenv(TEST_MARK, SESSION)
    mp.delenv("SERVEDECK_CONFIG", raising=False)
    yield home
    stop_everything(home)
    mp.undo()


@pytest.fixture(autouse=True)
def servedeck_home(door_home):
    """Overrides the root fixture: the module's door keeps one home across its tests."""
    return door_home


@pytest.fixture(scope="module")
def door(door_home, engines_ready, tmp_path_factory, request):
    """The module's door; a module's `door_toml(text) -> text` edits its models.toml first."""
    path = door_config(tmp_path_factory.mktemp("door-cfg"), engines_ready)
    edit = getattr(request.module, "door_toml", None)
    if edit is not None:
        path.write_text(edit(path.read_text()))
    cfg = load(path)
    d = DoorThread(cfg, ServeOptions(port=0, watch_interval_s=1.0))
    d.cfg = cfg
    d.home = door_home
    d.client = httpx.Client(base_url=d.url, timeout=120)
    yield d
    d.client.close()
    d.close()
    stop_everything(door_home)
