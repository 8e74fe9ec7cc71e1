"""A campaign file's shared-prefix and trace keys, checked where the file is read (campaign/file.py calls
these), the same as `servedeck bench --workload shared-prefix | trace`' options:

    kind = "shared-prefix"   groups, group_size, prefix_tokens, suffix_tokens, output_tokens, concurrency
                             (one value), seed
    kind = "trace"           trace (a JSONL file, relative to the campaign file), time_scale, window,
                             block_tokens, seed

A trace is read whole when the campaign file is (`trace_problems`): a bad line is refused before anything
launches, naming the workload, the file, the line and the field."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

from servedeck.campaign.conversation_keys import as_key
from servedeck.errors import UsageError

SHARED_PREFIX_KEYS = ("groups", "group_size", "prefix_tokens", "suffix_tokens")
TRACE_KEYS = ("trace", "time_scale", "window", "block_tokens")


def check_workload(w: Any) -> None:
    """One [[workloads]] entry's shared-prefix and trace keys (a ValueError names what is wrong; pydantic adds
    the path). The trace file itself is read by `trace_problems`, which knows where the campaign file is."""
    for kind, keys in (("shared-prefix", SHARED_PREFIX_KEYS), ("trace", TRACE_KEYS)):
        given = [k for k in keys if getattr(w, k) is not None]
        if w.kind != kind and given:
            raise ValueError(f"{', '.join(given)}: only a kind = \"{kind}\" workload takes {', '.join(keys)}")
    if w.kind == "shared-prefix":
        if w.rate:
            raise ValueError("a shared-prefix workload runs closed loop: drop rate (concurrency = [1])")
        try:
            shared_prefix_spec(w)
        except UsageError as e:
            raise ValueError(as_key(e.message, SHARED_PREFIX_KEYS + ("output_tokens", "concurrency"))) from None
    elif w.kind == "trace":
        if w.trace is None:
            raise ValueError("a trace workload replays a file: give trace = \"PATH.jsonl\" "
                             "(scripts/make_trace.py writes a small one)")
        if w.concurrency or w.rate:
            raise ValueError("a trace's schedule is its own: drop concurrency/rate (time_scale = 0.5 replays it "
                             "twice as fast)")
        try:
            trace_spec(w, Path("."), check=False)
        except UsageError as e:
            raise ValueError(as_key(e.message, TRACE_KEYS)) from None


def shared_prefix_spec(w: Any) -> Any:
    """A kind = "shared-prefix" entry → the SharedPrefixSpec `servedeck bench` would run, same defaults."""
    from servedeck.campaign.shared_prefix import SharedPrefixSpec, spec_from_options

    d = SharedPrefixSpec()
    return spec_from_options(groups=d.groups if w.groups is None else w.groups,
                             group_size=d.group_size if w.group_size is None else w.group_size,
                             prefix_tokens=d.prefix_tokens if w.prefix_tokens is None else w.prefix_tokens,
                             suffix_tokens=d.suffix_tokens if w.suffix_tokens is None else w.suffix_tokens,
                             output_tokens=w.output_tokens, concurrency=w.concurrency, content=None, seed=w.seed,
                             request_timeout_s="default")


def trace_spec(w: Any, base: Path, check: bool = True) -> Any:
    """A kind = "trace" entry → the TraceSpec `servedeck bench --workload trace` would run; `trace` relative to
    `base` (the campaign file's folder). `check`: the rules, and the trace read whole."""
    from servedeck.campaign.trace import TraceSpec
    from servedeck.timeparse import seconds

    path = Path(w.trace)
    spec = TraceSpec(path=path if path.is_absolute() else base / path,
                     time_scale=1.0 if w.time_scale is None else w.time_scale,
                     window_s=seconds(w.window, "--window") if w.window else None,
                     block_tokens=512 if w.block_tokens is None else w.block_tokens, seed=w.seed)
    if check:
        spec.check()
    else:  # the rules that need no file
        spec.check_options()
    return spec


def trace_problems(workloads: list[Any], campaign_path: Path) -> list[str]:
    """Every trace workload's file, read whole: one line per problem, naming the workload and the file."""
    out: list[str] = []
    for i, w in enumerate(workloads):
        if w.kind != "trace" or w.trace is None:
            continue
        try:
            trace_spec(w, campaign_path.parent)
        except UsageError as e:
            out.append(f"workloads.{i}.trace: {e.message}")
    return out


def spec_for(w: Any, campaign_path: Optional[Path]) -> Any:
    """The spec a shared-prefix or trace entry runs as (campaign/steps.py, the plan)."""
    if w.kind == "shared-prefix":
        return shared_prefix_spec(w)
    return trace_spec(w, campaign_path.parent if campaign_path else Path("."), check=False)
