"""Helpers for watch and fault tests: models.toml variants with small [host] timings, the stall
instrument as a build, and waiting for notices."""

from __future__ import annotations

import stat
import sys
import time
from pathlib import Path
from typing import Callable

from servedeck.config import Config
from servedeck.modelsfile import parse
from servedeck.watch.notices import read_notices
from ports import free_port  # noqa: F401 (the watch tests take it from here); below the kernel's ephemeral range: tests/ports.py says why

HERE = Path(__file__).parent
INSTRUMENT = HERE / "stall_instrument.py"
SECRET = "hf_SECRETvalue0123456789"


def with_host(cfg: Config, **host) -> Config:
    """The same models.toml with [host] keys set (tests use seconds where users keep minutes)."""
    lines = []
    for k, v in host.items():
        lines.append(f"{k} = {v!r}" if not isinstance(v, list) else f"{k} = {list(v)!r}".replace("'", '"'))
    text = cfg.path.read_text().replace("[host]\n", "[host]\n" + "\n".join(lines) + "\n", 1)
    cfg.path.write_text(text)
    return parse(text, cfg.path)


def edit(cfg: Config, old: str, new: str) -> Config:
    text = cfg.path.read_text()
    assert old in text, old
    text = text.replace(old, new, 1)
    cfg.path.write_text(text)
    return parse(text, cfg.path)


def add_instrument(cfg: Config, tmp_path: Path, port: int, *flags: str, name: str = "stuck") -> Config:
    """A build whose binary is the stall instrument (an executable wrapper: argv, no shell)."""
    wrapper = tmp_path / f"instrument-{name}"
    wrapper.write_text(f"#!{sys.executable}\nimport runpy, sys\nsys.argv[1:1] = {list(flags)!r}\n"
                       f"runpy.run_path({str(INSTRUMENT)!r}, run_name='__main__')\n")
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    text = cfg.path.read_text() + f"""
[builds.instrument-{name}]
engine = "llamacpp"
binary = "{wrapper}"

[models.{name}]
source = "{tmp_path / 'none.gguf'}"
build = "instrument-{name}"
port = {port}
slot = "{name}"
ready_timeout_s = 20
stop_timeout_s = 5
"""
    cfg.path.write_text(text)
    return parse(text, cfg.path)


def wait_for(pred: Callable[[], object], timeout: float, step: float = 0.1, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def kinds(model: str | None = None) -> list[str]:
    return [n["kind"] for n in read_notices(model=model)]

