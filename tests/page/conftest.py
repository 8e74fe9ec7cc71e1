"""The page tests share one history per module (pagekit.py makes it: launches, a crash, a soak, a campaign),
so the root conftest's per-test SERVEDECK_HOME is overridden here, as tests/door does: the module's home
and results stay put across its tests, and its engines are stopped by process group when it ends."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))  # pagekit.py
sys.path.insert(0, str(HERE.parent / "door"))  # cdp.py: headless Chromium over the DevTools protocol

from pagekit import SESSION, TEST_MARK, keep_dir  # noqa: E402


@pytest.fixture(scope="module")
def page_home(tmp_path_factory, request):
    keep = keep_dir(request)
    tmp = keep or tmp_path_factory.mktemp("page-state")
    home, results = tmp / "home", tmp / "results"
    home.mkdir(parents=True, exist_ok=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("SERVEDECK_HOME", str(home))
    mp.setenv("SERVEDECK_RESULTS", str(results))
    mp.setenv(TEST_MARK, SESSION)
    mp.delenv("SERVEDECK_CONFIG", raising=False)
    yield home
    from tests.conftest import stop_everything

    stop_everything(home)
    mp.undo()


@pytest.fixture(autouse=True)
def servedeck_home(page_home):
    """Overrides the root fixture: the module's history keeps one home across its tests."""
    return page_home
