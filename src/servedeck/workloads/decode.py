"""`decode`: the seed's decode-speed check. One fixed prompt on /v1/completions, sent for the warm-up and then
for every measured request, so that only decoding is measured: its figures are TPOT and decode tok/s per call;
prefill (TTFT) is excluded, and its summary says so."""

from __future__ import annotations

from typing import Any

from servedeck.mdtable import table
from servedeck.report.text import ms, num
from servedeck.workloads import points as P
from servedeck.workloads.shape import Kind

POINTS = P.POINT_KINDS["decode"]


def figures(view: dict[str, Any], mark: str) -> list[str]:
    rows = []
    for p in view.get("points") or []:
        d = p["figures"].get("decode") or {}
        c = p["figures"]["counts"]
        tp, rate = d.get("tpot_ms") or {}, d.get("decode_tok_s") or {}
        name = p["label"] + ("" if p.get("status") == "ok" else f" ({p.get('status')})")
        rows.append([name, f"{c['ok']}/{c['measured']}", f"{ms(tp.get('p50'))} / {ms(tp.get('max'))}",
                     f"{num(rate.get('p50'))} / {num(rate.get('min'))}"])
    return [f"## Figures{mark}", "",
            table(["point", "ok/measured", "TPOT p50/max", "decode tok/s p50/min"], rows), "",
            "Decode only: TPOT = (E2E − TTFT)/(output tokens − 1) per call, decode tok/s = 1/TPOT. Prefill is "
            "excluded: TTFT, prefill tok/s and throughput over the window include the prompt and are not "
            "figures of this workload."]


def headline(view: dict[str, Any]) -> str:
    return P.headlines(view, lambda label, h: f"{label}: TPOT {ms(h.get('tpot_p50_ms'))}, decode "
                                              f"{num(h.get('decode_tok_s_p50'))} tok/s")


def describe(w: dict[str, Any]) -> str:
    return P.describe(w, f"one fixed prompt of about {w.get('input_tokens')} tokens on /v1/completions, the same "
                         "for the warm-up and every measured call", fixed=True)


KIND = Kind(
    name="decode", help="one fixed prompt: TPOT and decode tok/s only",
    options=P.OPTIONS,
    from_options=lambda o: P.from_options(POINTS, o),
    from_entry=lambda w, where: [P.from_entry(POINTS, w, where)], answers_output_check=True,
    fitted=P.fitted, run=P.run,
    point_figures=POINTS.figures, describe=describe, figures=figures, headline=headline,
)
