"""A campaign file's capacity workload and [slo.NAME] tables: read, or refused naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from servedeck.campaign.file import parse
from servedeck.errors import ConfigError

GOOD = '''[campaign]
name = "cap"
model = "smollm2"
[[variants]]
name = "a"
[slo.interactive]
ttft_p95 = "2s"
error_rate = "1%"
[slo.batch]
e2e_p90 = "30s"
[[workloads]]
kind = "capacity"
find = "max-concurrency"
slo = ["interactive", "batch"]
max = 8
resolution = "10%"
'''


def test_slo_tables_are_parsed_by_name():
    slos = parse(GOOD, Path("c.toml")).slos
    assert {n: s.text for n, s in slos.items()} == {"interactive": "ttft_p95<=2s,error_rate<=1%",
                                                    "batch": "e2e_p90<=30s"}


@pytest.mark.parametrize("change, expect", [
    (('ttft_p95 = "2s"', 'ttft_p95 = "2"'), "c.toml: slo.interactive: 'ttft_p95<=2': the limit '2' has no unit"),
    (('slo = ["interactive", "batch"]', 'slo = ["fast"]'), "workloads[0].slo: no [slo.fast] table (tables: interactive, batch)"),
    (('find = "max-concurrency"\n', ''), "a capacity workload says what to find"),
    (('max = 8\n', 'max = 8\nconcurrency = [1, 2]\n'), "a capacity workload chooses its loads itself"),
    (('kind = "capacity"', 'kind = "chat"'), "only a kind = \"capacity\" workload takes"),
    (('resolution = "10%"', 'resolution = "ten"'), "resolution: 'ten' is not a percentage or a number"),
])
def test_mistakes_are_refused_naming_the_key(change, expect):
    with pytest.raises(ConfigError) as e:
        parse(GOOD.replace(*change), Path("c.toml"))
    assert expect in e.value.message
