"""Telemetry beside every measured point: the engine's /metrics and the GPUs' NVML readings,
sampled on their own thread into the run folder's telemetry.jsonl as they are taken, each line on
the client's monotonic clock (time.perf_counter, as requests.jsonl), and the figures rebuilt from
that file: energy per point and per token, power against its limit, peak KV usage, the engine's
longest queue, and each request's engine state at its arrival. docs/telemetry.md says more.

    series.py        the engine's named series out of one /metrics page
    nvml_source.py   NVML readings: live (pynvml) or replayed from a recorded capture
    sampler.py       the sampling threads and the lines they write
    point.py         the hook a measured point runs inside
    figures.py       per-point figures and the request join, from the file alone
"""
