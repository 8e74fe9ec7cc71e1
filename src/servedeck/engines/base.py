"""What every engine adapter provides, and the pieces they share.

An adapter is data plus a few pure functions: it turns a model + build into argv and env,
names its health endpoint, and reads facts out of its own boot log. It never starts anything;
the supervisor does that.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

if TYPE_CHECKING:
    from servedeck.config import Build, Config, Model

SECRET_KEY = re.compile(r"(TOKEN|SECRET|PASSWORD|PASSWD|API_?KEY|ACCESS_KEY|CREDENTIAL)", re.I)
SECRET_FLAGS = {"--api-key", "--hf-token", "--token", "--admin-api-key"}


@dataclass(frozen=True)
class LaunchSpec:
    """Exactly what `start` would run: argv (a list, never a shell string), the env it adds, where it listens."""

    model: str
    engine: str
    argv: list[str]
    env: dict[str, str]
    host: str
    port: int
    served_name: str
    health_path: str
    slot: str
    stop_timeout_s: float
    ready_timeout_s: float
    gpus: list[int] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)  # models.toml `request`: merged into every body

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def redacted_env(self) -> dict[str, str]:
        return {k: ("<redacted>" if SECRET_KEY.search(k) else v) for k, v in self.env.items()}

    def redacted_argv(self) -> list[str]:
        out, hide = [], False
        for a in self.argv:
            if hide:
                out.append("<redacted>")
                hide = False
                continue
            flag, eq, _ = a.partition("=")
            if flag in SECRET_FLAGS and eq:
                out.append(f"{flag}=<redacted>")
            else:
                out.append(a)
                hide = a in SECRET_FLAGS
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "engine": self.engine,
            "argv": self.redacted_argv(),
            "env": self.redacted_env(),
            "host": self.host,
            "port": self.port,
            "served_name": self.served_name,
            "health_path": self.health_path,
            "slot": self.slot,
            "gpus": self.gpus,
            "request": self.request,
        }


def flag_name(key: str) -> str:
    """args keys: `max_num_seqs` or `max-num-seqs` → `--max-num-seqs`; a key starting with '-' is used as written."""
    if key.startswith("-"):
        return key
    return "--" + key.replace("_", "-")


def render_args(args: dict[str, Any]) -> list[str]:
    """true → bare flag; false → omitted; table or list → one JSON argument; else str(value)."""
    out: list[str] = []
    for key, value in args.items():
        flag = flag_name(key)
        if value is True:
            out.append(flag)
        elif value is False:
            continue
        elif isinstance(value, (dict, list)):
            out += [flag, json.dumps(value, separators=(", ", ": "))]
        else:
            out += [flag, str(value)]
    return out


@dataclass(frozen=True)
class BootPattern:
    """One fact read from a boot log: a regex and how to turn its groups into fields."""

    name: str
    regex: re.Pattern
    convert: Callable[[re.Match], dict[str, Any]]


def num(s: str | None) -> float | int | None:
    if s is None:
        return None
    s = s.replace(",", "")
    try:
        return int(s)
    except ValueError:
        return float(s)


def parse_with(patterns: list[BootPattern], text: str) -> dict[str, Any]:
    """First match of each pattern wins (one DP rank speaks for all); a count is kept when ranks repeat it."""
    facts: dict[str, Any] = {}
    for p in patterns:
        matches = list(p.regex.finditer(text))
        if not matches:
            continue
        facts.update({k: v for k, v in p.convert(matches[0]).items() if v is not None})
        if len(matches) > 1:
            facts.setdefault("repeats", {})[p.name] = len(matches)
    return facts


class Engine:
    """Base for adapters. Subclasses set the class attributes and implement `command`."""

    name: str = ""
    health_path: str = "/health"
    supports_parallel: bool = False
    supports_gpu_memory_utilization: bool = False
    # flags servedeck renders from model keys: flag → key (so `args` cannot set them twice)
    owned_flags: dict[str, str] = {}
    boot_patterns: list[BootPattern] = []
    # Prometheus counters that show progress and prefix-cache use (loadgen and watch read them)
    metrics: dict[str, str] = {}
    # Speculative decoding, the engine's own account. Counters (servedeck name → Prometheus name):
    #   drafts            draft rounds proposed          draft_tokens     tokens proposed
    #   accepted_tokens   proposed tokens accepted       accepted_per_pos same, one series per `position`
    spec_metrics: dict[str, str] = {}
    # Per-response `timings` fields saying the same for one request (servedeck name → field).
    spec_timings: dict[str, str] = {}
    spec_note: str = ""  # how this engine's counters are to be read, shown beside its figures
    # Where the engine reports a request's own tokens, so two launches' outputs compare token by
    # token: extra body keys for a non-streamed chat request, read back by `output_token_ids`.
    output_tokens_request: dict[str, Any] = {}

    def speculation(self, argv: list[str]) -> dict[str, Any] | None:
        """How this launch speculates, read from its argv; None when it does not."""
        return None

    def output_token_ids(self, doc: dict[str, Any]) -> list[int] | None:
        """Token ids of a non-streamed chat answer; None when the engine did not give them."""
        return None

    @staticmethod
    def logprob_tokens(doc: dict[str, Any]) -> list[str] | None:
        """The answer's tokens as text, from OpenAI-style `logprobs.content[].bytes` (or `token`)."""
        try:
            content = doc["choices"][0]["logprobs"]["content"]
        except (KeyError, IndexError, TypeError):
            return None
        if not isinstance(content, list):
            return None
        out = []
        for item in content:
            b = item.get("bytes") if isinstance(item, dict) else None
            if isinstance(b, list):
                out.append(bytes(b).decode("utf-8", errors="replace"))
            elif isinstance(item, dict) and isinstance(item.get("token"), str):
                out.append(item["token"])
            else:
                return None
        return out

    def rendered_flag_owner(self, arg_key: str) -> str | None:
        return self.owned_flags.get(flag_name(arg_key))

    def command(self, name: str, model: "Model", build: "Build", cfg: "Config") -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def parse_boot(self, text: str) -> dict[str, Any]:
        return parse_with(self.boot_patterns, text)

    def render(self, name: str, cfg: "Config") -> LaunchSpec:
        model = cfg.models[name]
        build = cfg.deck.builds[model.build]
        argv, env = self.command(name, model, build, cfg)
        return LaunchSpec(
            model=name,
            engine=self.name,
            argv=argv,
            env=env,
            host=model.host,
            port=model.port,
            served_name=model.served_name or name,
            health_path=self.health_path,
            slot=model.slot,
            stop_timeout_s=model.stop_timeout_s,
            ready_timeout_s=model.ready_timeout_s,
            gpus=list(model.gpus),
            request=dict(model.request),
        )

    # --- shared by adapters ----------------------------------------------------------
    @staticmethod
    def base_env(model: "Model", build: "Build") -> dict[str, str]:
        env = dict(build.env)
        env.update(model.env)
        if model.gpus and not build.image:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in model.gpus)
        return env

    @staticmethod
    def docker_prefix(name: str, model: "Model", build: "Build", env: dict[str, str], source: str) -> list[str]:
        """`docker run` as the seed's cmd.sh: GPUs, host IPC and network, a big /dev/shm.

        Env values travel by name (`-e KEY`, value from servedeck's own environment) so that a
        secret never appears in argv, cmd.sh or `ps`.
        """
        import os

        gpus = "all" if not model.gpus else '"device=' + ",".join(str(g) for g in model.gpus) + '"'
        argv = [build.docker, "run", "--rm", "--name", f"servedeck-{name}", "--gpus", gpus,
                "--ipc=host", "--network=host", f"--shm-size={build.shm_size}"]
        for key in env:
            argv += ["-e", key]
        hf_home = os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface"))
        argv += ["-v", f"{hf_home}:/root/.cache/huggingface"]
        if source.startswith("/"):
            mount = source if not source.endswith(".gguf") else os.path.dirname(source)
            argv += ["-v", f"{mount}:{mount}:ro"]
        argv.append(build.image)
        return argv
