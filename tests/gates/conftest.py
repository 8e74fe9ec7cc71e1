"""The campaign tests' shared real servers (tests/campaign/conftest.py), for the gate tests: the same
fixtures, loaded from that file, so a gate test boots SmolLM2 on llama.cpp (or vLLM CPU) once per
session exactly as the campaign tests do."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("_campaign_servers", Path(__file__).parents[1] / "campaign" / "conftest.py")
assert _spec and _spec.loader
_servers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_servers)

campaign_home = _servers.campaign_home
servedeck_home = _servers.servedeck_home
campaign_config = _servers.campaign_config
llama = _servers.llama
vllm = _servers.vllm
