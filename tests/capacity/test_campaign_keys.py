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
    (('max = 8\n', 'max = 8\nstop_below = { fast = 2.0 }\n'),
     "stop_below.fast: not an SLO this workload searches under (slo = ['interactive', 'batch'])"),
    (('max = 8\n', 'max = 8\nstop_below = { batch = 0 }\n'),
     "stop_below.batch: expected good requests/s per GPU above 0, got 0"),
])
def test_mistakes_are_refused_naming_the_key(change, expect):
    with pytest.raises(ConfigError) as e:
        parse(GOOD.replace(*change), Path("c.toml"))
    assert expect in e.value.message


def test_stop_below_holds_the_search_under_its_slo_only():
    from servedeck.workloads.capacity import campaign_specs

    camp = parse(GOOD.replace("max = 8\n", "max = 8\nstop_below = { batch = 2.5 }\n"), Path("c.toml"))
    specs = campaign_specs(camp.file.workloads[0], camp.slos)
    assert [(s.slo.name, s.stop_below) for s in specs] == [("interactive", None), ("batch", 2.5)]
    assert specs[1].search_json()["stop_below"] == 2.5 and "stop_below" not in specs[0].search_json()
