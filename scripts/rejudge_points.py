"""Each point of a recorded run judged again under today's SLO rules (slo.judge), from its requests.jsonl and the
client self-check summary.json kept for it: how a rule change reads an old run, with nothing measured again.

    .venv/bin/python scripts/rejudge_points.py RUN_FOLDER "ttft_p90<=250ms,tpot_p90<=15ms"
"""
from __future__ import annotations

import collections
import json
import sys
from pathlib import Path

from servedeck.loadgen.records import RequestRecord
from servedeck.slo import judge, parse_slo


def main(folder: Path, slo_text: str) -> None:
    slo = parse_slo(slo_text)
    points = json.loads((folder / "summary.json").read_text())["points"]
    records: dict[int, list[RequestRecord]] = collections.defaultdict(list)
    for line in (folder / "requests.jsonl").read_text().splitlines():
        d = json.loads(line)
        records[d.pop("point")].append(RequestRecord.from_json(d))
    print("| point | load | verdict | client-bound | " + " | ".join(t.key for t in slo.thresholds) + " |")
    print("|---|---|---|---|" + "---|" * len(slo.thresholds))
    for i, p in enumerate(points):
        j = judge(records[i], slo, client=(p.get("figures") or {}).get("client"))
        values = " | ".join("-" if t["value"] is None else f"{t['value']:.1f}" for t in j["thresholds"])
        print(f"| {i} | {p.get('label')} | {'passed' if j['passed'] else 'failed'} | "
              f"{j['client_kind'] or 'no'} | {values} |")


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2])
