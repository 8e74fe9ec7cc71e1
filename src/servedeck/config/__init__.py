"""models.toml: schema, loading and validation."""

from servedeck.config.load import Config, Group, load, parse
from servedeck.config.schema import Build, Deck, Host, Model

__all__ = ["Build", "Config", "Deck", "Group", "Host", "Model", "load", "parse"]
