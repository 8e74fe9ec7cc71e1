"""`long-prompt`: one prompt near the context per request (--prompt-tokens, default what the context leaves
after the output), a few requests per point: prefill speed and time to first token at that length. Its points
go on the report's prompt-length curve, not on the load curves."""

from __future__ import annotations

from typing import Any, Optional

from servedeck.report.text import ms, num
from servedeck.workloads import points as P
from servedeck.workloads.shape import Kind, Option

POINTS = P.POINT_KINDS["long-prompt"]
PROMPT_TOKENS = Option("prompt_tokens", ("--prompt-tokens",), Optional[int], None,
                       "long-prompt: default context − output")


def headline(view: dict[str, Any]) -> str:
    return P.headlines(view, lambda label, h: f"{label}: TTFT {ms(h.get('ttft_p50_ms'))}, prefill "
                                              f"{num(h.get('prefill_tok_s_p50'))} tok/s")


KIND = Kind(
    name="long-prompt", help="a prompt near the context",
    options=P.OPTIONS + (PROMPT_TOKENS,),
    from_options=lambda o: P.from_options(POINTS, o),
    from_entry=lambda w, where: [P.from_entry(POINTS, w, where)], answers_output_check=True,
    fitted=P.fitted, run=P.run,
    describe=lambda w: P.describe(w, f"prompt {w.get('prompt_tokens')} tokens"),
    headline=headline, curve="length",
)
