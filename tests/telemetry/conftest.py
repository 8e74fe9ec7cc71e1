"""The campaign tests' shared real servers (tests/campaign/conftest.py: SmolLM2 on llama.cpp and on
vLLM's CPU build, booted once per session and stopped by process group), reused here as they are:
the fixtures are that file's own functions, bound into this directory."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("campaign_conftest_for_telemetry",
                                               Path(__file__).parents[1] / "campaign" / "conftest.py")
assert _spec and _spec.loader
_campaign = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_campaign)

campaign_home = _campaign.campaign_home
servedeck_home = _campaign.servedeck_home
campaign_config = _campaign.campaign_config
llama = _campaign.llama
vllm = _campaign.vllm
