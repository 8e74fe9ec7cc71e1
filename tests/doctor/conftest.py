import pytest


@pytest.fixture(autouse=True)
def _home(tmp_path, monkeypatch):
    """No test touches real servedeck state: SERVEDECK_HOME points at a temp dir."""
    home = tmp_path / "servedeck-home"
    monkeypatch.setenv("SERVEDECK_HOME", str(home))
    return home
