"""Issue 31 item 14: `servedeck render MODEL > file` is runnable as written. Piped, rich wrapped it at 80
columns inside tokens (a model path split over two lines), and the environment lines set shell variables
the engine never saw. Here the text is written to a file through a pipe and run with sh: llama-server
answers on the model's port with the environment it was given."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from servedeck.deck import Deck
from servedeck.modelsfile import load

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


@pytest.fixture
def long_paths_config(deck_config, tmp_path):
    """The starter, its SmolLM2 GGUF reached through a path far past 80 columns, one env value set."""
    deep = tmp_path / ("a-rather-long-directory-name-for-models-" * 2) / "and-another-level-of-folders"
    deep.mkdir(parents=True)
    gguf = Path(deck_config.models["smollm2"].source)
    (deep / gguf.name).symlink_to(gguf)
    text = deck_config.path.read_text().replace(f'source = "{gguf}"',
                                                f'source = "{deep / gguf.name}"\nenv = {{ LLAMA_ARG_N_PREDICT = "7" }}', 1)
    deck_config.path.write_text(text)
    return load(deck_config.path)


def test_render_piped_to_a_file_keeps_every_token_whole(long_paths_config, tmp_path):
    out = tmp_path / "cmd.txt"
    with open(out, "w") as fh:  # a file, not a terminal: what rich wrapped at 80 columns
        r = subprocess.run([SERVEDECK, "--config", str(long_paths_config.path), "render", "smollm2"], stdout=fh,
                           stderr=subprocess.PIPE, text=True, timeout=60, env={**os.environ, "COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    spec = Deck(long_paths_config).render("smollm2")
    assert max(len(line) for line in text.splitlines()) > 80  # the long path stays on its line
    assert subprocess.run(["sh", "-n", str(out)]).returncode == 0
    words = shlex.split(text.replace("\\\n", " "), comments=True)
    i = words.index(spec.argv[0])
    assert words[i:] == spec.redacted_argv()
    assert words[:i] == ["export", "LLAMA_ARG_N_PREDICT=7"]


def test_render_text_run_with_sh_serves_the_model(long_paths_config, tmp_path):
    out = tmp_path / "cmd.sh"
    with open(out, "w") as fh:
        subprocess.run([SERVEDECK, "--config", str(long_paths_config.path), "render", "smollm2"], stdout=fh,
                       check=True, timeout=60)
    port = long_paths_config.models["smollm2"].port
    log = open(tmp_path / "engine.log", "wb")
    proc = subprocess.Popen(["sh", str(out)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        props = None
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/props", timeout=2)
                if r.status_code == 200:
                    props = r.json()
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        assert props is not None, (tmp_path / "engine.log").read_text()[-2000:]
        # the exported env reached it: a request that names no length gets LLAMA_ARG_N_PREDICT's 7 tokens
        done = httpx.post(f"http://127.0.0.1:{port}/completion", json={"prompt": "1, 2, 3, 4, 5,"}, timeout=60).json()
        assert done["tokens_predicted"] == 7 and done["stop_type"] == "limit", done
        assert props["total_slots"] == 4  # --parallel 4 from args, as rendered
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
        log.close()
