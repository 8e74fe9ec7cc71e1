"""models.toml as the rest of servedeck reads it: config's own checks, then each engine's.

`servedeck.config` knows the file's shape and the rules between its entries; only the engine adapters
know their flags. This is where the two are composed, so that config never reaches into engines.
"""

from __future__ import annotations

from pathlib import Path

from servedeck.config import Config
from servedeck.config.load import load as config_load, parse as config_parse
from servedeck.engines import check_deck


def load(path: Path | str) -> Config:
    return config_load(Path(path), checks=(check_deck,))


def parse(text: str, path: Path | str) -> Config:
    return config_parse(text, Path(path), checks=(check_deck,))
