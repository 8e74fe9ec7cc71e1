"""models.toml: schema, loading and validation.

Reading the file is `servedeck.modelsfile.load` (these checks, then each engine's); config's own `load` and
`parse`, without the engines' checks, stay in config/load.py: re-exported here they would hide that module.
"""

from servedeck.config.load import Config, Group
from servedeck.config.schema import Build, Host, Model, ModelsToml

__all__ = ["Build", "Config", "Group", "Host", "Model", "ModelsToml"]
