"""models.toml: schema, loading and validation."""

from servedeck.config.load import Config, Group, load, parse
from servedeck.config.schema import Build, Host, Model, ModelsToml

__all__ = ["Build", "Config", "Group", "Host", "Model", "ModelsToml", "load", "parse"]
