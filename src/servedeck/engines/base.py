"""What every engine adapter provides, and the pieces they share.

An adapter is data plus a few pure functions: it turns a model + build into argv and env,
names its health endpoint, and reads facts out of its own boot log. It never starts anything;
the supervisor does that.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Optional

from servedeck import paths
from servedeck.engines.sleepmode import Call, ExpandPath, levels_wanted, sleep_key_text
from servedeck.redact import redact_argv, redact_env

if TYPE_CHECKING:
    from servedeck.config import Build, Config, Model


@dataclass(frozen=True)
class Endpoint:
    """Where a client talks to one running model: what a gate, a benchmark or the front door needs."""

    model: str
    engine: str
    base_url: str
    served_name: str
    health_path: str = "/health"
    request: dict[str, Any] = field(default_factory=dict)  # models.toml `request`: merged into every body


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
    # CPUs the launcher pins the engine to before exec (sched_setaffinity, inherited by every child);
    # empty for a container, whose argv carries --cpuset-cpus instead.
    cpus: list[int] = field(default_factory=list)
    request: dict[str, Any] = field(default_factory=dict)  # models.toml `request`: merged into every body
    max_output_tokens: int | None = None  # models.toml's cap on what servedeck's own requests ask for
    vision: bool = False
    embeddings: bool = False  # an embedding model: it answers /v1/embeddings only (probed there)
    # the levels this launch can sleep at (sleep mode rendered); empty: a switch stops it cold
    sleep_levels: list[int] = field(default_factory=list)
    sleep_note: str = ""  # why it cannot sleep, when its entry asked for sleeping (`sleep = "auto"`)

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
            "cpus": self.cpus,
            "request": self.request,
            "max_output_tokens": self.max_output_tokens,
            "vision": self.vision,
            "embeddings": self.embeddings,
            "sleep_levels": self.sleep_levels,
            "sleep_note": self.sleep_note,
            "ready_timeout_s": self.ready_timeout_s,
        }


def flag_name(key: str) -> str:
    """args keys: `max_num_seqs` or `max-num-seqs` → `--max-num-seqs`; a key starting with '-' is used as written.
    Spelling only: which flags mean the same thing is the engine's business (`Engine.canonical_flag`)."""
    if key.startswith("-"):
        return key
    return "--" + key.replace("_", "-")


def render_args(args: dict[str, Any]) -> list[str]:
    """true → bare flag; false → omitted; table or list → one JSON argument; else str(value)."""
    out: list[str] = []
    for key, value in args.items():
        flag_ = flag_name(key)
        if value is True:
            out.append(flag_)
        elif value is False:
            continue
        elif isinstance(value, (dict, list)):
            out += [flag_, json.dumps(value, separators=(", ", ": "))]
        else:
            out += [flag_, str(value)]
    return out


# Container names docker and podman accept (`names must match [a-zA-Z0-9][a-zA-Z0-9_.-]*`, podman 4.3; docker's
# daemon says the same): a model name may hold anything TOML allows, a campaign cell an `@` (`qwen38_27b@tp4`).
_NOT_IN_CONTAINER_NAMES = re.compile(r"[^a-zA-Z0-9_.-]+")


def container_name(model: str) -> str:
    """The container a launch of `model` runs in: `servedeck-<model, cleaned>-<8 hex>`. Cleaned: accents
    dropped, every run of other characters one `-`, at most 48 of them. The hex (sha256 of this
    SERVEDECK_HOME and the model's exact name) keeps it unique where cleaning alone would not: `a@b` and
    `a+b`, or one model under two homes on one container engine, where `rm -f` of one would end the other."""
    ascii_name = unicodedata.normalize("NFKD", model).encode("ascii", "ignore").decode()
    clean = _NOT_IN_CONTAINER_NAMES.sub("-", ascii_name).strip("-._")[:48].rstrip("-._") or "model"
    tag = hashlib.sha256(f"{paths.home().resolve()}\0{model}".encode()).hexdigest()[:8]
    return f"servedeck-{clean}-{tag}"


Post = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]  # POST path+JSON → JSON, errors raised by the caller


def token_count(doc: dict[str, Any]) -> int:
    """A /tokenize answer → its token count (`count` where given, else len(`tokens`))."""
    if isinstance(doc.get("count"), int):
        return doc["count"]
    if isinstance(doc.get("tokens"), list):
        return len(doc["tokens"])
    from servedeck.errors import RunError

    raise RunError(f"/tokenize answered without a count or tokens: {str(doc)[:200]}")


@dataclass(frozen=True)
class CacheReset:
    """How a running server's prefix cache is emptied without a restart (so that each arm of a
    comparison starts cold without paying a boot): POST `path`. `path` None: this launch cannot be;
    `why_not` says why and `hint` what would let it."""

    path: Optional[str] = None
    why_not: str = ""
    hint: str = ""


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


@dataclass(frozen=True)
class MemoryModel:
    """How an engine spends GPU memory: what the planner and the fit check need to know about it.

    kind   "pool"          a share of each GPU (total × share) holds weights, activations and a KV pool
                           sized at boot; the engine refuses to start unless that share is free (vLLM)
           "static-share"  the share covers weights + KV only; activations live outside it (SGLang)
           "allocate"      no share: the engine allocates what its flags ask for (context × slots) (llama.cpp)
    """

    kind: str = "pool"
    share_key: str = "gpu_memory_utilization"  # what the share is called in the engine's own words
    default_share: Optional[float] = None  # used when the model sets none; None: no share, the plan decides
    block_size: int = 16  # KV block size (tokens) on a GPU
    cpu_block_size: Optional[int] = None  # on a CPU backend, where it differs
    sliding_hold: str = "window"  # tokens a sliding layer holds: "window", "window+batched" (vLLM), "window+ubatch"
    fp32_downcast: bool = False  # 'auto' dtype turns an fp32 checkpoint into bf16
    kv_dtype_default: Optional[str] = None  # what 'auto' KV means (None: the model's dtype)
    whole_blocks_plus_one: bool = False  # sliding layers hold one more block than they need (vLLM)

    def required_share(self, set_share: Optional[float]) -> Optional[float]:
        """The share of each GPU that must be free for a start, or None when the plan must decide."""
        if self.kind == "allocate":
            return None
        if set_share is not None:
            return set_share
        return self.default_share


class Engine:
    """Base for adapters: everything that differs by engine lives on its adapter, so that no code
    outside `servedeck.engines` names an engine. Subclasses set the class attributes and implement
    `command`; a fork of an engine subclasses that engine's adapter and overrides what differs.

    The API an adapter's server is assumed to speak is the OpenAI one plus vLLM's /tokenize; an engine
    that differs (llama.cpp) overrides the request methods below.
    """

    name: str = ""
    health_path: str = "/health"
    supports_parallel: bool = False  # tp/dp/pp > 1
    memory: MemoryModel = MemoryModel(kind="allocate", share_key="")
    # flags servedeck renders from model keys: flag → key (so `args` cannot set them twice)
    owned_flags: dict[str, str] = {}
    # other spellings of one flag: alias → canonical (`-np` → `--parallel`); owned flags are matched through it
    flag_aliases: dict[str, str] = {}
    # what the engine takes for a flag left out, where that is one value on every machine (its --help says so):
    # canonical flag → value. `servedeck tune` places the starter's entry in the search space with it. A default
    # the engine works out at boot (threads, slots, a GPU-dependent batch) is left out: unknown is not guessed.
    flag_defaults: dict[str, Any] = {}
    boot_patterns: list[BootPattern] = []
    # the model's multimodal projector is a separate file passed by flag (llama.cpp's --mmproj)
    uses_mmproj: bool = False
    # the weight formats it serves, as discovery names them (servedeck.discover's Model.format): "gguf"
    # (a .gguf file), "hf" (a folder in Hugging Face layout); `servedeck init` picks a build by it
    weight_formats: tuple[str, ...] = ()
    # in a container image of the engine's own, the tags whose entrypoint is the server (llama.cpp's images
    # hold several tools: only its server-* tags serve); empty: every tag does
    image_server_tags: tuple[str, ...] = ()
    # Prometheus names by servedeck's names (loadgen, watch and campaign read them):
    #   prompt_tokens, generation_tokens, running, waiting     progress and queue
    #   prefix_queries, prefix_hits                            prompt tokens looked up / found in the prefix cache
    #   prompt_tokens_cached                                   tokens reused (engines that count processed + cached)
    #   kv_usage                                               share of the KV cache in use now (0..1, a gauge)
    #   preemptions                                            requests preempted so far (a counter)
    #   requests_finished                                      requests finished so far, every finish reason (a counter)
    metrics: dict[str, str] = {}
    # A line the engine's log writes once per request it finished: how requests are counted where its
    # /metrics keeps no such counter (llama.cpp)
    finished_request_line: Optional[re.Pattern] = None
    # The engine's own latency histograms on /metrics (seconds), by servedeck's names, each the Prometheus
    # names to try in order (versions rename them): read before and after a measured point so the point's
    # figures set the client's TTFT/TPOT/E2E beside the engine's account of the same requests
    # (runs/figures.py `histogram_agreement`). Keys: ttft, tpot (per request: decode time / (tokens − 1)),
    # itl (per token), e2e, queue (waiting before scheduled), prefill, decode.
    latency_histograms: dict[str, tuple[str, ...]] = {}
    # per-chunk token counts in streamed responses (`stream_options.continuous_usage_stats`)
    stream_usage_per_chunk: bool = False
    # the Python distributions that carry the engine and the package they install (doctor's RECORD check)
    dists: tuple[str, ...] = ()
    package: Optional[str] = None
    # GET path and JSON key where a running server states its version (None: the boot log says it)
    version_path: Optional[tuple[str, str]] = None
    # args keys that cap what the engine runs at once (llama.cpp slots, vLLM max_num_seqs)
    concurrency_flags: tuple[str, ...] = ()
    # a launch that sets no GPUs uses every visible one (llama.cpp) rather than the first tp×pp×dp
    uses_all_visible_gpus: bool = False
    # models.toml's `tools`: "parser" (the engine needs its tool-call parser named: vLLM, SGLang) or
    # "template" (it reads the call format from the chat template: `tools = true`, llama.cpp)
    tools_by: str = "parser"
    tool_parsers_hint: str = ""  # the parsers a user most likely wants, for the message when none is named
    # /v1/completions with `logprobs: N` answers in the chat API's shape (logprobs.content[]) instead of
    # the completions API's tokens / token_logprobs / top_logprobs / text_offset: the door converts it
    completion_logprobs_chat_shaped: bool = False
    # Sleep (engines/sleepmode.py): the levels at which the engine can keep its process and give its
    # GPU memory back; empty: it cannot sleep, and a switch stops it. `asleep_call` asks a running
    # server whether it sleeps (None: the engine has no such question).
    sleep_levels: tuple[int, ...] = ()
    asleep_call: Optional[Call] = None

    # --- identity ---------------------------------------------------------------------
    @property
    def supports_gpu_memory_utilization(self) -> bool:
        return self.memory.kind != "allocate"

    @property
    def lineage(self) -> tuple[str, ...]:
        """This engine's name and those of the adapters it derives from: a vLLM fork registered as
        `myvllm` is ("myvllm", "vllm"), so vLLM's crash signatures and facts apply to it too."""
        out: list[str] = []
        for cls in type(self).__mro__:
            n = cls.__dict__.get("name")
            if n and n not in out:
                out.append(n)
        if self.name and self.name not in out:
            out.insert(0, self.name)
        return tuple(out)

    # --- flags --------------------------------------------------------------------------
    def booted_flags(self, log: str) -> dict[str, Any]:
        """What this engine worked out at boot for flags it leaves to itself (not in flag_defaults: llama.cpp's
        threads), read from its own log: canonical flag → value. `servedeck tune` places the starter there in the
        search space. {} where the engine says nothing of the kind."""
        return {}

    def canonical_flag(self, key: str) -> str:
        """An args key in the one spelling argv uses: `parallel`, `--parallel`, `-np` → `--parallel`."""
        flag = flag_name(key)
        return self.flag_aliases.get(flag, flag)
    # Speculative decoding, the engine's own account. Counters (servedeck name → Prometheus name):
    #   drafts            draft rounds proposed          draft_tokens     tokens proposed
    #   accepted_tokens   proposed tokens accepted       accepted_per_pos same, one series per `position`
    spec_metrics: dict[str, str] = {}
    # Per-response `timings` fields saying the same for one request (servedeck name → field).
    spec_timings: dict[str, str] = {}
    spec_note: str = ""  # how this engine's counters are to be read, shown beside its figures
    # Said when the server returns no logprobs of the prompt's own tokens, which loglikelihood and
    # multiple-choice evaluations (lm-eval) score by: "" when it returns them.
    no_prompt_logprobs: str = ""
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
        return self.owned_flags.get(self.canonical_flag(arg_key)) or self.owned_flags.get(flag_name(arg_key))

    def arg(self, model: "Model", *names: str) -> Any:
        """A model arg by any spelling of any of `names` (`kv_cache_dtype`, `--kv-cache-dtype`, `-ctk`)."""
        wanted = {self.canonical_flag(n) for n in names}
        for key, value in model.args.items():
            if self.canonical_flag(key) in wanted:
                return value
        return None

    def has_arg(self, model: "Model", *names: str) -> bool:
        wanted = {self.canonical_flag(n) for n in names}
        return any(self.canonical_flag(k) in wanted for k in model.args)

    def render_model_args(self, model: "Model") -> list[str]:
        """`args` as argv, in the user's own spelling (check_model refuses two spellings of one flag)."""
        return render_args(model.args)

    def concurrency_cap(self, model: "Model", boot: dict[str, Any]) -> Optional[int]:
        """What the engine itself will run at once, from the model's flags or its boot log; None if unknown."""
        v = self.arg(model, *self.concurrency_flags) if self.concurrency_flags else None
        if v is not None:
            return int(v)
        return int(boot["slots"]) if boot.get("slots") else None

    # --- config checks (composed with config's own where models.toml is loaded) ----------
    def check_model(self, key: str, model: "Model") -> list[str]:
        """Problems of one [models.NAME] that only this engine can see; `key` is its key path."""
        problems = []
        seen: dict[str, str] = {}
        for arg in model.args:
            owner = self.rendered_flag_owner(arg)
            if owner:
                problems.append(f"{key}.args.{arg}: servedeck renders this flag from {key}.{owner}; set that key instead")
            flag = self.canonical_flag(arg)
            if flag in seen:
                problems.append(f"{key}.args.{arg}: the same flag as {key}.args.{seen[flag]} ({flag}); keep one of them")
            seen.setdefault(flag, arg)
        problems += self.check_tools(key, model)
        if model.gpu_memory_utilization is not None and not self.supports_gpu_memory_utilization:
            problems.append(f"{key}.gpu_memory_utilization: engine {self.name!r} has no such setting; remove the key")
        if model.tp * model.dp * model.pp > 1 and not self.supports_parallel:
            problems.append(f"{key}: tp/dp/pp > 1 is not supported by engine {self.name!r}")
        if model.mmproj and not self.uses_mmproj:
            problems.append(f"{key}.mmproj: engine {self.name!r} takes no projector file; remove the key "
                            "(vision = true is all it needs)")
        elif model.mmproj and not model.vision:
            problems.append(f"{key}.mmproj is set but vision is not; set vision = true, or remove mmproj")
        elif model.vision and self.uses_mmproj and not model.mmproj:
            problems.append(f"{key}: vision = true on engine {self.name!r} needs the projector file; "
                            'set mmproj = "/path/to/mmproj.gguf" (rendered as --mmproj)')
        return problems

    def check_tools(self, key: str, model: "Model") -> list[str]:
        """`tools` in the form this engine takes: a parser's name, or `true` where the template decides."""
        if self.tools_by == "template" and isinstance(model.tools, str):
            return [f"{key}.tools = {model.tools!r}: engine {self.name!r} takes no parser name, it reads the "
                    "tool-call format from the chat template; write tools = true (and chat_template = FILE "
                    "when the model's own template does not describe tools)"]
        if self.tools_by == "parser" and model.tools is True:
            return [f"{key}.tools = true: engine {self.name!r} needs its tool-call parser named for the model's "
                    f"family, e.g. {self.tool_parsers_hint}"]
        return []

    # --- sleep ------------------------------------------------------------------------------
    def sleep_unavailable(self, model: "Model", build: "Build", expand: ExpandPath | None = None) -> str | None:
        """Why a launch of `model` on `build` cannot sleep at all, when it positively cannot; None when it
        can (or it cannot be told from here). `expand` turns the build's paths into real ones: with it an
        adapter may look at the install (its distributions); without it, only the file's own words."""
        if not self.sleep_levels:
            return f"engine {self.name!r} has no sleep mode"
        return None

    def check_sleep(self, key: str, model: "Model", build: "Build", expand: ExpandPath | None = None) -> list[str]:
        """`sleep = 1` or `2` that this engine or build cannot honour: refused (at load without `expand`,
        at render with it). `sleep = "auto"` is never refused: it sleeps where it can."""
        if model.sleep in (False, "auto"):
            return []
        said = sleep_key_text(model.sleep)
        blocked = self.sleep_unavailable(model, build, expand)
        if blocked:
            return [f"{key}.sleep: {said}, but {blocked}; a switch would stop it cold. Set sleep = false "
                    f'(or "auto", which sleeps where the engine can)']
        if not levels_wanted(model.sleep, self.sleep_levels):
            levels = ", ".join(str(lv) for lv in self.sleep_levels)
            return [f"{key}.sleep: {said}, but engine {self.name!r} sleeps at level {levels} only; "
                    f'set sleep = {self.sleep_levels[0]} or "auto"']
        return []

    def sleep_launch(self, levels: tuple[int, ...]) -> tuple[dict[str, Any], dict[str, str]]:
        """(args, env) a launch needs to be able to sleep at `levels`."""
        return {}, {}

    def sleep_calls(self, level: int) -> list[Call]:
        """The requests that put a running server to sleep at `level`, in order."""
        return []

    def wake_calls(self, level: int) -> list[Call]:
        """The requests that wake a server asleep at `level` until it serves as before, in order."""
        return []

    def is_asleep(self, doc: Any) -> bool | None:
        """The answer to `asleep_call`: whether the server sleeps; None when it does not say."""
        return None

    def sleep_plan(self, name: str, model: "Model", build: "Build", expand: ExpandPath) -> tuple[tuple[int, ...], str]:
        """(the levels a launch of `name` will be able to sleep at, why it cannot when its entry asked).
        Raises ConfigError for `sleep = 1`/`2` that this engine or build cannot honour."""
        from servedeck.errors import ConfigError

        if model.sleep is False:
            return (), ""
        problems = self.check_sleep(f"models.{name}", model, build, expand)
        if problems:
            raise ConfigError(problems[0], hint="levels 1 and 2: vLLM on CUDA or ROCm; level 1: SGLang; llama.cpp "
                                                "and vLLM's CPU build cannot sleep (\"auto\" switches them cold)")
        blocked = self.sleep_unavailable(model, build, expand)
        if blocked:
            return (), blocked
        return levels_wanted(model.sleep, self.sleep_levels), ""

    # --- memory -----------------------------------------------------------------------------
    def default_gpus(self, model: "Model", visible: list[int]) -> list[int]:
        """The GPUs a launch would use: `gpus` when set; else what the engine takes by default."""
        if model.gpus:
            return list(model.gpus)
        if self.uses_all_visible_gpus:
            return visible or [0]
        n = model.tp * model.pp * model.dp
        return visible[:n] if len(visible) >= n else list(range(n))

    # the flag whose JSON the engine merges into the model's config.json (vLLM --hf-overrides); None: none
    config_override_flag: Optional[str] = None

    def config_overrides(self, model: "Model") -> dict[str, Any]:
        """What this launch overrides in the model's config.json (a models.toml table, or the JSON string the
        flag takes), so that a plan reads the config the engine will: seed 000's 1M run set its YaRN rope
        scaling this way. {} when it overrides nothing. A value that is not a JSON object is a user mistake."""
        from servedeck.errors import UsageError

        raw = self.arg(model, self.config_override_flag) if self.config_override_flag else None
        if raw is None or raw is False:
            return {}
        if isinstance(raw, str):
            try:
                raw = json.loads(raw)
            except ValueError as e:
                raise UsageError(f"args.{self.config_override_flag.lstrip('-')}: not JSON ({e})",
                                 hint="write it as a TOML table, or as a JSON object in a string") from None
        if not isinstance(raw, dict):
            raise UsageError(f"args.{self.config_override_flag.lstrip('-')}: expected a JSON object, got {raw!r}",
                             hint='e.g. { text_config = { rope_parameters = { rope_type = "yarn", factor = 4.0 } } }')
        return raw

    def plan_knobs(self, model: "Model", env: dict[str, str]) -> dict[str, Any]:
        """What the memory planner needs from this launch's flags and env (PlanInputs fields)."""
        kvmem = self.arg(model, "kv_cache_memory_bytes")
        return {"kv_dtype": str(self.arg(model, "kv_cache_dtype") or "auto"),
                "pool_bytes": int(float(kvmem)) if kvmem is not None else None}

    # --- talking to a running server ------------------------------------------------
    async def count_chat(self, post: Post, served_name: str, messages: list[dict[str, str]]) -> int:
        """Tokens the server will prefill for this chat request, template and generation prompt included."""
        return token_count(await post("/tokenize", {"model": served_name, "messages": messages}))

    def telemetry_series(self) -> dict[str, str]:
        """The /metrics series the telemetry sampler reads through a run (servedeck name → Prometheus
        name): KV usage, running and waiting requests, preemptions, prefix-cache hits (tokens), tokens
        generated, speculation drafts and accepted tokens. A key this engine has no series for is absent."""
        keys = ("kv_usage", "running", "waiting", "preemptions", "prefix_hits", "generation_tokens")
        out = {k: self.metrics[k] for k in keys if k in self.metrics}
        if "prefix_hits" not in out and "prompt_tokens_cached" in self.metrics:
            out["prefix_hits"] = self.metrics["prompt_tokens_cached"]  # tokens reused from the cache, same meaning
        for ours, theirs in (("spec_drafts", "drafts"), ("spec_accepted", "accepted_tokens")):
            if theirs in self.spec_metrics:
                out[ours] = self.spec_metrics[theirs]
        return out

    def prefix_counters(self, metrics: dict[str, float]) -> Optional[dict[str, float]]:
        """{"queries": prompt tokens looked up, "hits": found in the cache} from a parsed /metrics page."""
        q, h = self.metrics.get("prefix_queries"), self.metrics.get("prefix_hits")
        if q and h and q in metrics and h in metrics:
            return {"queries": metrics[q], "hits": metrics[h]}
        done, cached = self.metrics.get("prompt_tokens"), self.metrics.get("prompt_tokens_cached")
        if done and cached and done in metrics and cached in metrics:
            return {"queries": metrics[done] + metrics[cached], "hits": metrics[cached]}
        return None

    def requests_finished(self, metrics: Optional[dict[str, float]], log_text: Optional[str] = None) -> Optional[int]:
        """Requests the server has finished since it started: its /metrics counter (`requests_finished`)
        where it keeps one, else the lines its log writes per finished request (`finished_request_line`);
        None when neither says."""
        name = self.metrics.get("requests_finished")
        if name and metrics and name in metrics:
            return int(metrics[name])
        if self.finished_request_line is not None and log_text is not None:
            return len(self.finished_request_line.findall(log_text))
        return None

    def prefix_cache_reset(self, env: dict[str, str]) -> CacheReset:
        """How a server launched with this environment (the engine's whole environment: servedeck's own
        plus the launch's) empties its prefix cache while it runs."""
        return CacheReset(None, f"servedeck knows no way to empty {self.name}'s prefix cache while it runs",
                          "restart the server")

    def prefix_cache_reset_done(self, status: int, text: str) -> bool:
        """Whether the answer to the reset POST says the cache was emptied."""
        return 200 <= status < 300

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
        levels, sleep_note = self.sleep_plan(name, model, build, cfg.expand)
        if levels:  # what sleeping needs travels as the model's own args and env (a container gets it by -e)
            extra_args, extra_env = self.sleep_launch(levels)
            model = model.model_copy(update={"args": {**model.args, **extra_args}, "env": {**model.env, **extra_env}})
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
            cpus=[] if build.image else list(model.cpus),
            request=dict(model.request),
            max_output_tokens=model.max_output_tokens,
            vision=model.vision,
            embeddings=model.embeddings,
            sleep_levels=list(levels),
            sleep_note=sleep_note,
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
        argv = [build.docker, "run", "--rm", "--name", container_name(name), "--gpus", gpus, "--ipc=host", "--network=host"]
        if "podman" not in os.path.basename(build.docker):
            # podman refuses --shm-size beside --ipc=host ("cannot set shmsize when running in the host IPC
            # namespace", 4.3); docker accepts it, as the seed's cmd.sh has both. /dev/shm is the host's either way.
            argv.append(f"--shm-size={build.shm_size}")
        if model.cpus:
            from servedeck.hostcpu import cpulist_text, numa_nodes_of

            argv.append("--cpuset-cpus=" + cpulist_text(model.cpus))
            # memory from the nodes models.toml names (cpus.mems), else from those of the CPUs on this host,
            # as the seed pinned each arm to its socket (a plan for another host sets them from its topology)
            nodes = model.cpu_mems or numa_nodes_of(model.cpus)
            if nodes:
                argv.append("--cpuset-mems=" + ",".join(str(n) for n in nodes))
        for key in env:
            argv += ["-e", key]
        hf_home = os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface"))
        argv += ["-v", f"{hf_home}:/root/.cache/huggingface"]
        if source.startswith("/"):
            mount = os.path.dirname(source) if source.endswith(".gguf") or os.path.isfile(source) else source
            argv += ["-v", f"{mount}:{mount}:ro"]
        argv.append(build.image)
        return argv
