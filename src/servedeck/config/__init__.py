"""models.toml: schema, loading and validation."""

from servedeck.config.load import Config, load, parse
from servedeck.config.schema import Build, Deck, Host, Model

__all__ = ["Build", "Config", "Deck", "Host", "Model", "load", "parse"]
