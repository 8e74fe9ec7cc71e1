"""scripts/setup.sh's prerequisite steps, run for real on this machine with a prerequisite hidden from PATH.

A fresh machine is not needed to test them: a PATH made of links to every program on the real PATH but
one hides that one, and the step then does on this machine what it does on a machine without it (the
Chromium step really runs apt-get; the package is already installed, so apt-get has nothing to fetch)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

SETUP = Path(__file__).resolve().parents[2] / "scripts" / "setup.sh"


@pytest.fixture
def scratch():
    """A folder other users can enter: pytest's tmp_path sits in root's 0700 folder, and both apt's
    methods (run as the _apt user) and the non-root test must reach the PATH built here."""
    folder = Path(tempfile.mkdtemp(prefix="servedeck-setup-"))
    os.chmod(folder, 0o755)
    yield folder
    shutil.rmtree(folder)


def path_without(scratch: Path, *hidden: str) -> str:
    """A one-folder PATH linking every program on today's PATH except `hidden`."""
    farm = scratch / "bin"
    farm.mkdir()
    for folder in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(folder):
            continue
        for name in os.listdir(folder):
            target = os.path.join(folder, name)
            if name in hidden or (farm / name).exists() or not os.access(target, os.X_OK):
                continue
            (farm / name).symlink_to(target)
    return str(farm)


def setup(*args: str, path: str, cache: Path, user: str | None = None) -> subprocess.CompletedProcess:
    env = {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "SERVEDECK_CACHE": str(cache), "LANG": "C.UTF-8"}
    cmd = ["bash", str(SETUP), *args]
    if user:
        cmd = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in env.items()), *cmd]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)


def rows(out: str) -> dict[str, tuple[str, str]]:
    table = {}
    for line in out.splitlines()[1:]:
        name, state, how = line.split(None, 2)
        table[name] = (state, how)
    return table


def test_check_names_every_prerequisite_and_how_it_is_got(tmp_path):
    r = setup("--check", path=os.environ["PATH"], cache=tmp_path / "cache")
    assert r.returncode == 0, r.stderr
    assert set(rows(r.stdout)) == {"compiler", "cmake", "venv", "pip", "chromium", "root"}


def test_check_says_set_up_installs_a_missing_cmake(scratch):
    r = setup("--check", path=path_without(scratch, "cmake"), cache=scratch / "cache")
    assert rows(r.stdout)["cmake"] == ("missing", "installs Debian's cmake (apt-get, as root)")


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("runuser"), reason="needs root to run set-up as another user")
def test_without_root_set_up_stops_naming_the_package_and_the_command(scratch):
    cache = scratch / "cache"
    cache.mkdir()
    os.chmod(cache, 0o777)
    r = setup("--prereqs", "cmake", path=path_without(scratch, "cmake", "sudo"), cache=cache, user="nobody")
    assert r.returncode == 1
    assert "run 'sudo apt-get install -y cmake', then set-up again" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the Chromium step installs with apt-get, which needs root here")
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="the step's install is checked against Debian's chromium")
def test_chromium_step_with_chromium_hidden_from_path_installs_and_succeeds(scratch):
    """Before the fix this step exited 1 ("could not install Debian's chromium"): apt-cache, piped into
    `grep -q` under pipefail, died of SIGPIPE (141) whenever Chromium was not on PATH."""
    r = setup("--prereqs", "chromium", path=path_without(scratch, "chromium"), cache=scratch / "cache")
    [log] = (scratch / "cache" / "logs").glob("setup-*-apt.log")
    assert "gpgv" not in log.read_text()  # apt's methods reached the PATH
    assert r.returncode == 0, r.stderr
    assert "installing Debian's chromium" in r.stderr
    assert "chromium is installed as /usr/bin/chromium, which is not on this PATH" in r.stderr


@pytest.mark.skipif(os.geteuid() != 0, reason="the Chromium step installs with apt-get, which needs root here")
@pytest.mark.skipif(not Path("/usr/bin/chromium").exists(), reason="the step's install is checked against Debian's chromium")
def test_two_set_ups_keep_their_own_logs(scratch):
    """Two set-ups on one machine wrote one setup-*.log each step, the second over the first's."""
    path = path_without(scratch, "chromium")
    for _ in range(2):
        r = setup("--prereqs", "chromium", path=path, cache=scratch / "cache")
        assert r.returncode == 0, r.stderr
    logs = sorted((scratch / "cache" / "logs").glob("setup-*-apt.log"))
    assert len(logs) == 2 and all(p.stat().st_size > 0 for p in logs), logs


def test_an_unknown_prerequisite_is_refused_naming_the_known_ones(tmp_path):
    r = setup("--prereqs", "chrome", path=os.environ["PATH"], cache=tmp_path / "cache")
    assert r.returncode == 2
    assert "unknown prerequisite 'chrome': expected one of compiler cmake venv pip chromium" in r.stderr
