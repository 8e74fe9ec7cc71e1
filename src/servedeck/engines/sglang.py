"""SGLang. No build runs on servedeck's CI machines: this adapter is argv rendering and log parsing,
tested on log text written from the facts in ENGINES.md, not on a real server. Its sleep (memory saver)
is likewise rendered and described from SGLang's documented server arguments and endpoints only."""

from __future__ import annotations

import re

from servedeck.engines.base import BootPattern, Engine, MemoryModel, num
from servedeck.engines.sleepmode import Call


class SGLang(Engine):
    name = "sglang"
    health_path = "/health"  # 503 while starting
    supports_parallel = True
    # --mem-fraction-static covers weights + KV; activations live outside it. No share set: the plan decides.
    memory = MemoryModel(kind="static-share", share_key="mem_fraction_static", block_size=16, fp32_downcast=True)
    weight_formats = ("hf",)
    dists = ("sglang",)
    package = "sglang"
    concurrency_flags = ("--max-running-requests",)
    module = "sglang.launch_server"
    owned_flags = {
        "--model-path": "source", "--host": "host", "--port": "port",
        "--served-model-name": "served_name", "--context-length": "context",
        "--mem-fraction-static": "gpu_memory_utilization",
        "--tp-size": "tp", "--dp-size": "dp", "--pp-size": "pp",
        "--tool-call-parser": "tools", "--chat-template": "chat_template", "--is-embedding": "embeddings",
        "--enable-memory-saver": "sleep", "--enable-weights-cpu-backup": "sleep",
    }
    tool_parsers_hint = ('tools = "qwen25" (Qwen 2.5 and 3), "llama3", "mistral", "deepseekv3", "pythonic"; '
                         "`python -m sglang.launch_server --help` lists them under --tool-call-parser (from SGLang's "
                         "documentation: no SGLang runs here)")
    flag_aliases = {"--tp": "--tp-size", "--dp": "--dp-size", "--model": "--model-path"}
    metrics = {
        "prompt_tokens": "sglang:prompt_tokens_total",
        "generation_tokens": "sglang:generation_tokens_total",
        "running": "sglang:num_running_reqs",
        "waiting": "sglang:num_queue_reqs",
        "cache_hit_rate": "sglang:cache_hit_rate",
        # SGLang's production-metrics page: "sglang:token_usage" is the share of KV-cache tokens in use
        # (documented only: no SGLang runs here). It documents no preemption (retraction) counter.
        "kv_usage": "sglang:token_usage",
    }
    # Sleep: `--enable-memory-saver` lets /release_memory_occupation hand the GPU memory back and
    # /resume_memory_occupation take it again; `--enable-weights-cpu-backup` (SGLang 0.5.3 and later)
    # keeps the weights in host memory meanwhile, which is vLLM's level 1. A level 2 (weights discarded,
    # reloaded with /update_weights_from_disk) is not offered: nothing here could check it.
    sleep_levels = (1,)

    def sleep_launch(self, levels):
        return {"--enable-memory-saver": True, "--enable-weights-cpu-backup": True}, {}

    def sleep_calls(self, level):
        return [Call("POST", "/release_memory_occupation", json={})]

    def wake_calls(self, level):
        return [Call("POST", "/resume_memory_occupation", json={})]

    boot_patterns = [
        BootPattern("kv_alloc",
                    re.compile(r"KV Cache is allocated\. #tokens:\s*([\d,]+), K size:\s*([\d.]+) GB, V size:\s*([\d.]+) GB"),
                    lambda m: {"kv_tokens": num(m.group(1)),
                               "kv_gib": round(float(m.group(2)) + float(m.group(3)), 3)}),
        BootPattern("max_total", re.compile(r"max_total_num_tokens=([\d,]+)"),
                    lambda m: {"max_total_num_tokens": num(m.group(1))}),
        BootPattern("context_len", re.compile(r"context_len=([\d,]+)"), lambda m: {"context_len": num(m.group(1))}),
        BootPattern("ready", re.compile(r"The server is fired up and ready to roll!"), lambda m: {"app_started": True}),
    ]

    def command(self, name, model, build, cfg):
        env = self.base_env(model, build)
        source = cfg.expand(model.source) if model.source.startswith(("/", "~", ".", "$")) else model.source
        flags = ["--model-path", source, "--served-model-name", model.served_name or name,
                 "--host", model.host, "--port", str(model.port)]
        if model.context:
            flags += ["--context-length", str(model.context)]
        if model.gpu_memory_utilization is not None:
            flags += ["--mem-fraction-static", str(model.gpu_memory_utilization)]
        for flag, n in (("--tp-size", model.tp), ("--dp-size", model.dp), ("--pp-size", model.pp)):
            if n > 1:
                flags += [flag, str(n)]
        if model.tools:  # SGLang parses calls whenever a parser is named (no auto-choice switch)
            flags += ["--tool-call-parser", str(model.tools)]
        if model.chat_template:
            flags += ["--chat-template", cfg.expand(model.chat_template)]
        if model.embeddings:
            flags.append("--is-embedding")
        flags += self.render_model_args(model)
        if build.image:
            return self.docker_prefix(name, model, build, env, source) + ["python3", "-m", self.module] + flags, env
        if build.binary:
            return [cfg.expand(build.binary)] + flags, env
        return [cfg.expand(build.python), "-m", self.module] + flags, env


ENGINE = SGLang()
