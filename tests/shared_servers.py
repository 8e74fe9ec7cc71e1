"""One real server per engine, booted once per session and shared by every test that only reads from it
(the campaign, gate, telemetry and vLLM page tests), then stopped by process group. vLLM boots in ~70 s on 2 cores
(minutes when the machine is busy), so booting it per test, or once per test directory, is not an option:
these fixtures live here, once, and tests/conftest.py imports them, so every directory gets the same
instance (three directories each booting their own vLLM cost ~2.5 min of the suite, 2026-12-03).

The shared servers live in one session home; a directory whose tests use them overrides `servedeck_home`
with `uses_session_home` below, so its tests see that home (where the shared servers' live records are)
and their own results directory.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

import pytest

from servedeck.config import Config
from servedeck.modelsfile import load
from servedeck.deck import Deck
from servedeck.supervisor.process import members_if_ours, stop_group
from ports import free_port, starter_toml  # below the kernel's ephemeral range: tests/ports.py says why

TEST_MARK = "SERVEDECK_TEST_RUN"  # as tests/conftest.py: the session guard finds what carries this session's pid
SESSION = str(os.getpid())


LLAMA_CONTEXT = 8192  # per request: SmolLM2's training context, so a gate near the limit is possible


@pytest.fixture(scope="session")
def campaign_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("campaign-home")


def uses_session_home(campaign_home: Path, tmp_path: Path, monkeypatch) -> Iterator[Path]:
    """The body of a directory's `servedeck_home` override: a session home (where its shared servers' live
    records are), this test's results."""
    monkeypatch.setenv("SERVEDECK_HOME", str(campaign_home))
    monkeypatch.setenv(TEST_MARK, SESSION)
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    monkeypatch.delenv("SERVEDECK_CONFIG", raising=False)
    yield campaign_home


def campaign_toml() -> str:
    """The starter models.toml with free ports, one slot per model, SmolLM2 at its 8K context on
    llama.cpp, per-request cached-token counts and dev mode's endpoints on vLLM, and a throwaway model
    for the kill test."""
    text = starter_toml()
    n = iter(range(1, 10))
    text = re.sub(r'slot = "main"', lambda m: f'slot = "s{next(n)}"', text)
    llama = re.search(r"\[models\.smollm2\]\n(.*?)\n\n", text, re.S)
    assert llama
    block = re.sub(r"^context = \d+", f"context = {LLAMA_CONTEXT}", llama.group(0), count=1, flags=re.M)
    text = text.replace(llama.group(0), block)
    vllm = re.search(r"\[models\.smollm2-vllm\]\n(.*?)\n\n", text + "\n\n", re.S)
    assert vllm
    # the starter turns on per-request cached_tokens for vLLM; the cache tests rely on it
    assert "enable-prompt-tokens-details = true" in vllm.group(0)
    # dev mode adds endpoints and changes nothing measured: tests/engines/test_vllm_prefix_reset.py empties
    # this server's prefix cache in place (POST /reset_prefix_cache) rather than booting a vLLM of its own
    env = 'env = { VLLM_CPU_KVCACHE_SPACE = "2" }'
    assert env in vllm.group(0)
    # the vLLM tests' figures (a ramp to 4K, the boot's 4,096-token requests) are sized for 4,096 tokens, half
    # the starter's SmolLM2 context: float32 prefill on 2 cores makes the whole 8K twice as slow to reach
    block = re.sub(r"^context = \d+.*$", "context = 4096", vllm.group(0), count=1, flags=re.M)
    text = text.replace(vllm.group(0), block.replace(
        env, 'env = { VLLM_CPU_KVCACHE_SPACE = "2", VLLM_SERVER_DEV_MODE = "1" }'))
    source = re.search(r'source = "([^"]+\.gguf)"', llama.group(0))
    assert source
    text += (f'\n[models.victim]\nsource = "{source.group(1)}"\nbuild = "llamacpp"\nport = {free_port()}\n'
             'slot = "victim"\ncontext = 2048\nargs = { parallel = 2 }\n')
    # issue 10: the same model speculating with n-grams (no draft model), for the speculation figures
    # and the identical-output check against the plain launch above
    text += (f'\n[models.smollm2-spec]\nsource = "{source.group(1)}"\nbuild = "llamacpp"\nport = {free_port()}\n'
             'slot = "spec"\ncontext = 4096\n'
             'args = { parallel = 1, spec-type = "ngram-simple", spec-draft-n-max = 4 }\n')
    return text


@pytest.fixture(scope="session")
def campaign_config(tmp_path_factory, engines_ready) -> Config:
    path = tmp_path_factory.mktemp("campaign-config") / "models.toml"
    path.write_text(campaign_toml())
    return load(path)


def shared_server(cfg: Config, home: Path, name: str) -> Iterator[dict]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVEDECK_HOME", str(home))
        mp.setenv(TEST_MARK, SESSION)
        rec = Deck(cfg).start(name).record
        try:
            yield rec
        finally:
            try:
                Deck(cfg).stop([name], grace_s=20)
            finally:
                stop_group(rec.pgid, 5, leader_create_time=rec.create_time)
            assert not members_if_ours(rec.pgid, rec.create_time), f"{name}'s process group outlived the session"


@pytest.fixture(scope="session")
def llama(campaign_config, campaign_home) -> Iterator[dict]:
    """SmolLM2 on llama.cpp: 4 slots of 8192 tokens."""
    yield from shared_server(campaign_config, campaign_home, "smollm2")


@pytest.fixture(scope="session")
def llama_spec(campaign_config, campaign_home) -> Iterator[dict]:
    """SmolLM2 on llama.cpp with n-gram speculation (--spec-type ngram-simple --spec-draft-n-max 4)."""
    yield from shared_server(campaign_config, campaign_home, "smollm2-spec")


@pytest.fixture(scope="session")
def gemma(campaign_config, campaign_home) -> Iterator[dict]:
    """Gemma 3 270M on llama.cpp: a different model, whose greedy output must differ from SmolLM2's."""
    yield from shared_server(campaign_config, campaign_home, "gemma")


@pytest.fixture(scope="session")
def vllm(campaign_config, campaign_home) -> Iterator[dict]:
    """SmolLM2 converted to HF layout, on vLLM's CPU build (context 4096)."""
    yield from shared_server(campaign_config, campaign_home, "smollm2-vllm")

