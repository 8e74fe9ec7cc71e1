"""Load generation: a streaming client, request records, load shapes, prompts and statistics.

    specs = synthetic_requests(tokens=1000, max_tokens=256, n=200)
    warm = list(synthetic_requests(1000, 256, n=4, kind="warmup"))
    async with StreamingClient(ClientConfig("http://127.0.0.1:8000", model="m")) as client:
        await client.prewarm(64)
        result = await run_load(client, ClosedLoop(64), specs, warmup=warm, on_record=write_line)
    figures = summarize_run(result, slo=Slo(ttft_ms=500, tpot_ms=50))

Several client processes on one schedule: ProcessLoadRun(config, shape, specs, procs=N, ...).
One request at a time (gates, the ramp, the soak, reference outputs): ApiClient(base_url).chat(body)
and friends (loadgen/api.py), on the same client, text and usage back.
Definitions of every figure: docs/loadgen.md. The measuring instrument used to check this
package's timing is servedeck.testing.instrument (a separate process, not part of the runtime).
"""

from servedeck.loadgen.api import ApiClient, Reply
from servedeck.loadgen.client import ClientConfig, Streamer, StreamingClient
from servedeck.loadgen.prompts import (
    TokenCounter,
    fit_prompt,
    new_nonce,
    sized_requests,
    synthetic_requests,
    synthetic_text,
)
from servedeck.loadgen.records import RequestRecord, RequestSpec
from servedeck.loadgen.procs import ProcessLoadRun
from servedeck.loadgen.schedule import ClosedLoop, LoadResult, LoadRun, OpenLoop, Progress, Shape, run_load
from servedeck.loadgen.stats import Slo, Thresholds, summarize, summarize_run

__all__ = [
    "ApiClient", "ClientConfig", "ClosedLoop", "LoadResult", "LoadRun", "OpenLoop", "ProcessLoadRun", "Progress", "Reply", "RequestRecord",
    "RequestSpec", "Shape", "Slo", "Streamer", "StreamingClient", "Thresholds", "TokenCounter",
    "fit_prompt", "new_nonce", "run_load", "sized_requests", "summarize", "summarize_run",
    "synthetic_requests", "synthetic_text",
]
