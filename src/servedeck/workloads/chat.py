"""`chat`: every request a prompt of --input-tokens (by the server's own count, chat template included) and an
answer of --output-tokens, one measured point per concurrency (closed loop) or arrival rate (open loop); the
machinery is points.py's, shared with long-prompt and decode."""

from __future__ import annotations

from servedeck.workloads import points as P
from servedeck.workloads.shape import Kind

POINTS = P.POINT_KINDS["chat"]

KIND = Kind(
    name="chat", help="--input-tokens/--output-tokens per request",
    options=P.OPTIONS,
    from_options=lambda o: P.from_options(POINTS, o),
    from_entry=lambda w, where: [P.from_entry(POINTS, w, where)], answers_output_check=True,
    fitted=P.fitted, run=P.run,
    describe=lambda w: P.describe(w, f"input {w.get('input_tokens')} tokens"),
)
