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

REDACTED = "<redacted>"
# A name (env key, flag, JSON key) that holds a secret: any spelling containing KEY, SECRET, PASSWORD,
# PASSWD or CREDENTIAL, or TOKEN where the word ends (HF_TOKEN, --hf-token, access_token). TOKENS,
# TOKENIZER and TOKEN_ID are counts and names, not secrets (--max-num-batched-tokens, --tokenizer).
SECRET_KEY = re.compile(r"KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|TOKEN(?![A-Za-z]|[-_]IDS?(?![A-Za-z]))", re.I)
# Values that are secrets whatever they are called: well-known token formats (Hugging Face, OpenAI and
# Anthropic, GitHub, Slack, AWS, GitLab, Google). Long enough that an ordinary word never matches.
SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|glpat-[A-Za-z0-9_-]{20,}"
    r"|AIza[0-9A-Za-z_-]{30,})"
)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_KEY.search(name))


def redact_text(text: str) -> str:
    """Token-formatted values replaced wherever they stand in a string."""
    return SECRET_VALUE.sub(REDACTED, text)


def _redact_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_name(str(k)) and isinstance(v, (str, int, float)) else _redact_json(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_redact_json(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def _redact_value(value: str) -> str:
    """A flag value: a JSON table/list has its secret-named keys hidden; any string its token formats."""
    if value[:1] in "[{":
        try:
            parsed = json.loads(value)
        except ValueError:
            return redact_text(value)
        cleaned = _redact_json(parsed)
        return value if cleaned == parsed else json.dumps(cleaned, separators=(", ", ": "))
    return redact_text(value)


def redact_argv(argv: list[str]) -> list[str]:
    """The one place argv is made safe to show or write (cmd.sh, launch.json, render, units, run folders).

    A flag whose name is secret-like (`--api-key V`, `--hf-token=V`) has its value hidden; every other
    value keeps its shape but loses token-formatted substrings and secret-named JSON keys' values.
    A secret-named flag followed by another flag is a bare switch and hides nothing.
    """
    out: list[str] = []
    hide = False
    for a in argv:
        if hide and not a.startswith("--"):
            out.append(REDACTED)
            hide = False
            continue
        hide = False
        flag, eq, value = a.partition("=")
        if a.startswith("-") and eq:
            out.append(f"{flag}={REDACTED}" if is_secret_name(flag) else f"{flag}={_redact_value(value)}")
        elif a.startswith("-"):
            out.append(a)
            hide = is_secret_name(a)
        else:
            out.append(_redact_value(a))
    return out


def redact_settings_args(args: dict[str, Any]) -> dict[str, Any]:
    """models.toml `args` as desired.json keeps them: a secret-named key's value, or a value holding a
    token, is stored as `<redacted>` (restore takes it back from the current models.toml)."""
    out: dict[str, Any] = {}
    for k, v in args.items():
        secret = is_secret_name(k) or (SECRET_VALUE.search(json.dumps(v)) is not None)
        out[k] = REDACTED if secret and v is not True and v is not False else v
    return out


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Env with secret-named keys, and values in a known token format, replaced by `<redacted>`."""
    return {k: (REDACTED if is_secret_name(k) or SECRET_VALUE.search(v or "") else v) for k, v in env.items()}


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
    max_output_tokens: int | None = None  # models.toml's cap on what servedeck's own requests ask for
    vision: bool = False

    def output_cap(self, wanted: int) -> int:
        """`wanted` output tokens, held to the model's max_output_tokens."""
        return min(wanted, self.max_output_tokens) if self.max_output_tokens else wanted

    @property
    def base_url(self) -> str:
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{self.port}"

    def redacted_env(self) -> dict[str, str]:
        return redact_env(self.env)

    def redacted_argv(self) -> list[str]:
        return redact_argv(self.argv)

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
            "max_output_tokens": self.max_output_tokens,
            "vision": self.vision,
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
    # the model's multimodal projector is a separate file passed by flag (llama.cpp's --mmproj)
    uses_mmproj: bool = False
    # Prometheus counters that show progress and prefix-cache use (loadgen and watch read them)
    metrics: dict[str, str] = {}

    def rendered_flag_owner(self, arg_key: str) -> str | None:
        return self.owned_flags.get(flag_name(arg_key))

    def command(self, name: str, model: "Model", build: "Build", cfg: "Config") -> tuple[list[str], dict[str, str]]:
        raise NotImplementedError

    def version(self, build: "Build | None", stated: str | None = None) -> str | None:
        """The version to record for a launch of `build`: `stated` is what the server or binary said
        (/version, /props, `--version`, the boot log). Adapters whose builds can say more override this."""
        return stated

    def parse_boot(self, text: str) -> dict[str, Any]:
        return parse_with(self.boot_patterns, text)

    def render(self, name: str, cfg: "Config") -> LaunchSpec:
        model = cfg.models[name]
        build = cfg.deck.builds[model.build]
        if model.mmproj and not self.uses_mmproj:
            from servedeck.errors import ConfigError

            raise ConfigError(f"models.{name}.mmproj: engine {self.name!r} takes no projector file",
                              hint="mmproj is llama.cpp's; remove the key (vision = true is enough here)")
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
            max_output_tokens=model.max_output_tokens,
            vision=model.vision,
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
