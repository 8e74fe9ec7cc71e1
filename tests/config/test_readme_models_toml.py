"""The README's models.toml is copied by people: it must load as written and render what its comments say."""

from __future__ import annotations

import re
from pathlib import Path

from servedeck.deck import Deck
from servedeck.modelsfile import load

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_toml() -> str:
    [block] = re.findall(r"```toml\n(.*?)```", README.read_text(), re.S)
    return block


def test_the_readmes_models_toml_loads_and_renders_one_llamacpp_and_one_vllm_model(tmp_path):
    path = tmp_path / "models.toml"
    path.write_text(readme_toml())
    cfg = load(path)
    deck = Deck(cfg)
    engines = {name: deck.render(name).engine for name in cfg.models}
    assert sorted(engines.values()) == ["llamacpp", "vllm"], engines
    [vllm] = [n for n, e in engines.items() if e == "vllm"]
    argv = deck.render(vllm).argv
    assert "--enable-sleep-mode" in argv  # its comment says switching away sleeps it
    assert cfg.resolve("llama3") == vllm  # its alias
    slots = {cfg.models[n].slot for n in cfg.models}
    assert len(slots) == 1  # one slot: `switch` swaps the two, as the comment says
