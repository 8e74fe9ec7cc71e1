"""An unknown key is answered with the keys that table takes, not a pointer to documentation a wheel's user
does not have (issue 50 item 8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servedeck.config.load import parse
from servedeck.errors import ConfigError

BASE = '[builds.b]\nengine = "llamacpp"\nbinary = "/x/llama-server"\n\n[models.m]\nsource = "/x/m.gguf"\nbuild = "b"\nport = 8081\n'


def refusal(text: str) -> ConfigError:
    with pytest.raises(ConfigError) as e:
        parse(text, Path("models.toml"))
    return e.value


def test_a_misspelt_key_names_the_key_it_may_have_meant():
    e = refusal(BASE + "contxt = 4096\n")
    assert "models.toml: models.m.contxt: unknown key: did you mean context?" in e.message
    assert "docs/" not in e.message + (e.hint or "")


def test_a_key_like_none_lists_what_the_table_takes():
    e = refusal('[builds.b]\nengine = "llamacpp"\nbinary = "/x"\nzzz = 1\n')
    assert "builds.b.zzz: unknown key (this table takes: binary, docker, engine, env, image, notes, python, " in e.message
