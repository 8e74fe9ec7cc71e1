"""The ramp's turn on the load generator's client: what the stall watch sees while it streams."""

from __future__ import annotations

import asyncio

from servedeck.workloads.ramp import stream_turn
from servedeck.workloads.stall import Quiet, StallWatch
from servedeck.loadgen.api import ApiClient
from servedeck.testing.instrument_process import InstrumentProcess

BODY = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40, "stream": True,
        "stream_options": {"include_usage": True}}


def test_a_turn_cut_by_its_time_limit_says_how_many_tokens_had_come():
    """The watch reads the stream's progress through the client (Quiet.follow): a turn stopped by
    its limit 0.7 s into a 2-second stream reports the chunks that came, not 0."""
    inst = InstrumentProcess("--ttft-ms", "20", "--itl-ms", "50", "--tokens", "40")
    try:
        async def go() -> dict:
            async with ApiClient(inst.url) as api:
                quiet = Quiet()
                watch = StallWatch(None, None, 0.7, on_tick=lambda q: None, tick_s=0.1)  # type: ignore[arg-type]
                task = asyncio.ensure_future(stream_turn(api, BODY, quiet))
                verdict = await watch.watch(task, quiet)
                assert verdict is not None
                return {"verdict": verdict, "tokens": quiet.tokens}

        out = asyncio.run(go())
    finally:
        inst.stop()
    assert out["verdict"]["status"] == "timed-out"
    assert 0 < out["tokens"] < 40  # some came (not the 0 a watch blind to the stream would say), not all


def test_a_whole_turn_brings_its_text_and_usage():
    inst = InstrumentProcess("--ttft-ms", "5", "--itl-ms", "2", "--tokens", "40")
    try:
        async def go():
            async with ApiClient(inst.url) as api:
                return await stream_turn(api, {**BODY, "max_tokens": 4}, Quiet())

        turn = asyncio.run(go())
    finally:
        inst.stop()
    assert turn.status == "ok" and turn.content == " t0 t1 t2 t3"
    assert turn.usage is not None and turn.usage["completion_tokens"] == 4
    assert turn.t_first is not None and turn.t_end is not None and turn.t_send < turn.t_first <= turn.t_end
    assert turn.chunks == 4 and turn.finish_reason == "length"
