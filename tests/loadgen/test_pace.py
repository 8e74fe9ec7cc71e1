"""Who set a point's pace, and whether its lag matters: servedeck.loadgen.pace, pure.

Cases chosen before the code, most from the 2026-12-06 H100 runs (docs/gpu-runs/h100-vllm-2026-12-06/README.md):
plain SmolLM2 on vLLM, SLO ttft_p90<=250ms,tpot_p90<=15ms, 512 in / 128 out, 4 s points on a 16-CPU host.
- c=32 with 4 client processes: lag p99 6.7 ms, busiest process at 7 % of a core, TTFT p90 114 ms, TPOT p90 2.6 ms:
  the client had CPU to spare and 6.7 ms is 2.7 % of a 250 ms limit: the point stands.
- the same with the 8.1 ms lag of the campaign's second measure, and c=16 with one process at 15 % (7.9 ms): stands.
- a lag of 40 ms against that 250 ms TTFT limit (16 %) matters, whatever the margin.
- the same 40 ms against TPOT alone (128 tokens: 0.31 ms per token against 15 ms) does not.
- a client process at 95 % of a core is short of CPU (and saturated); one at 1 % of a core that waited for a core
  62 % of its window is short (measured here: a loop pinned to a core 64 busy loops hold); one at 60 % that waited
  20 % idled a fifth of its window (not short), one at 75 % that waited 20 % never idled (short); one at 7 % that waited 3 % is not (the 2026-12-06 client).
- a lag that matters from a loop running 30 % of its window and waiting 2 % is the loop's own (a wave of streams
  ending together: more processes split it); one from a loop at 5 % waiting 44 % (or with no schedstat) is the host's.
- a closed loop whose streams each sat 10 % of their time waiting on the client's late sends did not hold its
  concurrency: that matters even where every figure is far from its limit.
"""

from __future__ import annotations

import pytest

from servedeck.loadgen.pace import (ProcUse, Reading, lag_matters, lag_reach_ms, loop_fell_behind, more_procs,
                                    saturated, short_of_cpu)

SLO_0612 = lambda ttft, tpot: [Reading("ttft_p90", "ttft", ttft, 250.0), Reading("tpot_p90", "tpot", tpot, 15.0)]  # noqa: E731


def _lags(p99_ms: float, n: int = 200, base_ms: float = 0.5) -> list[float]:
    """n sends, the slowest 2 % at p99_ms (so the p99 is that and more than one request is over any lower bar)."""
    late = max(3, n // 50)
    return [base_ms] * (n - late) + [p99_ms] * late


@pytest.mark.parametrize("p99, ttft", [(6.7, 114.0), (8.1, 114.0), (7.9, 130.0)])
def test_the_2026_12_06_lags_beside_a_250_ms_limit_do_not_void_the_point(p99, ttft):
    assert lag_matters(_lags(p99), SLO_0612(ttft, 2.6), output_tokens=128, e2e_mean_ms=450.0, closed_loop=True) == []


def test_a_lag_that_is_a_material_share_of_the_limit_voids_it():
    why = lag_matters(_lags(40.0), SLO_0612(114.0, 2.6), output_tokens=128, e2e_mean_ms=450.0, closed_loop=True)
    assert len(why) == 1 and "ttft_p90" in why[0] and "250" in why[0]


def test_tpot_sees_the_lag_spread_over_the_answer():
    assert lag_reach_ms("tpot", 40.0, 128) == pytest.approx(40.0 / 127)
    only_tpot = [Reading("tpot_p90", "tpot", 2.6, 15.0)]
    assert lag_matters(_lags(40.0), only_tpot, output_tokens=128, e2e_mean_ms=450.0, closed_loop=True) == []
    assert lag_reach_ms("error_rate", 40.0, 128) == 0.0


def test_one_late_send_alone_never_voids_a_point():
    lags = [0.5] * 50 + [90.0]
    assert lag_matters(lags, SLO_0612(114.0, 2.6), output_tokens=128, e2e_mean_ms=450.0, closed_loop=True) == []


def test_a_closed_loop_that_waited_on_its_client_did_not_hold_its_load():
    lags = [50.0] * 100  # every send 50 ms late beside 450 ms requests: streams idle 10 % of the time
    why = lag_matters(lags, [Reading("e2e_p90", "e2e", 450.0, 60_000.0)], output_tokens=128, e2e_mean_ms=450.0,
                      closed_loop=True)
    assert len(why) == 1 and "concurrency" in why[0]
    # an open loop's late sends shift arrivals; they do not idle a stream
    assert lag_matters(lags, [Reading("e2e_p90", "e2e", 450.0, 60_000.0)], output_tokens=128, e2e_mean_ms=450.0,
                       closed_loop=False) == []


def test_short_of_cpu_by_its_own_use_or_by_never_idling():
    assert short_of_cpu([ProcUse(None, cpu_s=3.8, wall_s=4.0, wait_s=0.1)])  # 95 % of a core
    assert saturated([ProcUse(None, cpu_s=3.8, wall_s=4.0, wait_s=0.1)])
    starved = short_of_cpu([ProcUse(1, cpu_s=0.04, wall_s=4.0, wait_s=2.48)])  # 1 % running, 62 % waiting
    assert starved and "process 1" in starved[0] and "waited for a core 62%" in starved[0]
    assert not saturated([ProcUse(1, cpu_s=0.04, wall_s=4.0, wait_s=2.48)])
    assert short_of_cpu([ProcUse(0, cpu_s=2.4, wall_s=4.0, wait_s=0.8)]) == []  # 60 % + 20 %: it idled
    never_idle = short_of_cpu([ProcUse(0, cpu_s=3.0, wall_s=4.0, wait_s=0.8)])  # 75 % + 20 %
    assert never_idle and "never idled" in never_idle[0]
    assert short_of_cpu([ProcUse(0, cpu_s=0.28, wall_s=4.0, wait_s=0.12)]) == []  # 7 %: the 2026-12-06 client
    assert short_of_cpu([ProcUse(0, cpu_s=0.28, wall_s=4.0, wait_s=None)]) == []  # no schedstat: CPU alone
    assert short_of_cpu([ProcUse(0, cpu_s=0.45, wall_s=0.5, wait_s=0.0)]) == []  # under a second: start-up noise


def test_more_client_processes_as_the_free_cores_allow():
    n, why = more_procs(1, free_cores=13.2, streams=32)  # a 16-CPU host, vLLM busy on ~3
    assert n == 13 and "13" in why
    assert more_procs(1, free_cores=13.2, streams=8)[0] == 8  # no process without a stream
    n, why = more_procs(1, free_cores=0.3, streams=4)  # a box with no free core: one more, and it says so
    assert n == 2 and "no free core" in why
    assert more_procs(4, free_cores=2.0, streams=4) == (None, "every stream already has its own client process")


def test_a_lag_is_the_loops_own_when_it_ran_more_than_it_waited():
    own = loop_fell_behind(0.30, 0.02)
    assert own and "while it had the CPU" in own and "30%" in own
    assert loop_fell_behind(0.05, 0.44) is None  # waiting for cores others held: the host's
    assert loop_fell_behind(0.07, None) is None  # the 2026-12-06 figures: no schedstat, the host's by default
