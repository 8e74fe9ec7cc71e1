"""The shape of models.toml. Pydantic checks each value; `load.py` adds the checks that span entries."""

from __future__ import annotations

from typing import Any, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

ArgValue = Union[bool, int, float, str, list, dict]


# Body keys servedeck decides per request: the gate needs temperature 0 and its own max_tokens, a
# benchmark its streaming options and ignore_eos. A `request` table may set anything else.
REQUEST_OWNED = frozenset({"model", "messages", "prompt", "stream", "stream_options", "max_tokens",
                           "max_completion_tokens", "n", "temperature", "ignore_eos"})


def merge_request(body: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """`body` with a model's `request` table merged in; tables merge key by key, other values replace."""
    out = dict(body)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge_request(out[key], value)
        else:
            out[key] = value
    return out


# Ranges checked at load, so that a typo is named by its key instead of failing in the engine: llama.cpp
# parses -c and -n with std::stoi (an int32: context 10^12 died with "stoi"), vLLM's ints are as narrow.
INT32_MAX = 2**31 - 1
# No host has more GPUs or a model more servers than this; a bigger tp/dp/pp or replicas is a typo (and
# would make servedeck list that many GPUs or models).
MAX_PARALLEL = 1024
# A duration past 30 days is a typo: Python's own waits overflow past ~292 years ("timestamp out of range").
MAX_DURATION_S = 30 * 24 * 3600


def cpulist(v: Any, key: str) -> Any:
    """A CPU or node list as people write it: [0, 1, 2] or the kernel's "0-23,96-119" (a string)."""
    if not isinstance(v, str):
        return v
    out: list[int] = []
    for part in v.replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or (hi and int(hi) < int(lo)):
            raise ValueError(f"{key}: {v!r} is not a list like \"0-23,96-119\" (ranges and numbers, comma-separated)")
        out += list(range(int(lo), int(hi or lo) + 1))
    return out


def split_cpu_table(data: Any) -> Any:
    """`cpus` in any of its forms → `cpus` (CPU numbers) and `cpu_mems` (memory nodes), as fields:
        cpus = [0, 1, 2, 3]                           CPUs; memory: their nodes where the launch is rendered
        cpus = "0-23,96-119"                          the same, as the kernel writes a cpulist
        cpus = { set = "0-23,96-119", mems = "0,1" }  CPUs and their memory nodes (seed 000: --cpuset-mems 0,1)
        cpus = [{ set = "0-23", mems = [0] }, { set = "24-47", mems = [1] }]   one per replica
    """
    if not isinstance(data, dict) or "cpus" not in data:
        return data
    v = data["cpus"]

    def one(x: Any) -> tuple[Any, Any]:
        if isinstance(x, dict):
            stray = sorted(set(x) - {"set", "mems"})
            if stray or "set" not in x:
                raise ValueError(f"cpus: a table takes set (the CPUs) and mems (their memory nodes), got "
                                 f"{', '.join(sorted(x)) or 'nothing'}")
            return cpulist(x["set"], "cpus.set"), cpulist(x.get("mems", []), "cpus.mems")
        return cpulist(x, "cpus"), None

    if isinstance(v, (dict, str)):
        cpus, mems = one(v)
    elif isinstance(v, list) and v and all(isinstance(x, (dict, str, list)) for x in v):
        parts = [one(x) for x in v]
        cpus, mems = [c for c, _ in parts], ([m or [] for _, m in parts] if any(m for _, m in parts) else None)
    else:
        return data
    if mems and data.get("cpu_mems"):
        raise ValueError("cpus.mems and cpu_mems both given: keep one")
    return {**data, "cpus": cpus, **({"cpu_mems": mems} if mems else {})}


# systemd.service(5)'s Restart= values, for `unit_restart`
UNIT_RESTART = ("no", "on-success", "on-failure", "on-abnormal", "on-watchdog", "on-abort", "always")


def int_range(v: Any, lo: int, hi: int, unit: str) -> Any:
    """`v` unless it is outside lo..hi; the message says the range and the unit."""
    if v is not None and not lo <= v <= hi:
        raise ValueError(f"{v} is out of range (expected {lo} to {hi} {unit})")
    return v


def duration(v: Any) -> Any:
    """Seconds, refused past MAX_DURATION_S (the lower bound is each key's own Field)."""
    if v is not None and v > MAX_DURATION_S:
        raise ValueError(f"{v:g} s is out of range (expected at most {MAX_DURATION_S} seconds, 30 days)")
    return v


class _Strict(BaseModel):
    # Unknown keys are errors: a typo must never be ignored silently.
    model_config = ConfigDict(extra="forbid", frozen=True)


class Host(_Strict):
    """[host]: facts and policies about this machine."""

    results_dir: Optional[str] = None
    power_min_w: Optional[float] = Field(default=None, gt=0)
    power_max_w: Optional[float] = Field(default=None, gt=0)
    on_notice: list[str] = Field(default_factory=list)  # argv run for each notice; never through a shell
    relaunch_tries: int = Field(default=3, ge=0)
    relaunch_spacing_s: float = Field(default=60.0, ge=0)
    liveness_interval_s: float = Field(default=30.0, gt=0)
    stall_after_s: float = Field(default=120.0, gt=0)
    # the front door (`servedeck serve`, docs/door.md)
    preload: list[str] = Field(default_factory=list)  # models started when `serve` starts
    api_keys: list[str] = Field(default_factory=list)  # any of these is accepted as a bearer key
    queue_max: int = Field(default=64, ge=0)  # requests waiting per model for it to start; past it: 429
    drain_timeout_s: float = Field(default=120.0, ge=0)  # a switch waits this long for in-flight requests
    min_residency_s: float = Field(default=30.0, ge=0)  # a slot switches at most once per this while both have traffic
    request_wait_s: float = Field(default=900.0, gt=0)  # a queued request gives up (504) after this
    # request bodies the door holds at once, all clients together (MiB); past it: 503 with Retry-After.
    # Unset: an eighth of the host's memory, at least one largest body (256 MiB; door/front.py)
    body_budget_mib: Optional[float] = Field(default=None, gt=0)
    # sleeping models (docs/config.md#sleep): level 1 keeps a model's weights in pinned host memory, and is
    # chosen only while they fit in what the host has available less this margin, and (when set) in
    # sleep_ram_gib, the most host memory every model asleep at level 1 may hold together
    sleep_ram_gib: Optional[float] = Field(default=None, gt=0)
    sleep_ram_margin_gib: float = Field(default=4.0, ge=0)
    # a start is refused when $SERVEDECK_HOME has less free (MiB): the engine's log grows while it runs
    min_free_mib: float = Field(default=64.0, ge=0)

    @field_validator("relaunch_spacing_s", "liveness_interval_s", "stall_after_s", "drain_timeout_s",
                     "min_residency_s", "request_wait_s")
    @classmethod
    def _durations(cls, v: float) -> float:
        return duration(v)

    @field_validator("api_keys")
    @classmethod
    def _keys(cls, v: list[str]) -> list[str]:
        if any(len(k) < 8 for k in v):
            raise ValueError("every api key must be at least 8 characters long")
        return v

    @model_validator(mode="after")
    def _power_order(self) -> "Host":
        if self.power_min_w and self.power_max_w and self.power_min_w > self.power_max_w:
            raise ValueError(f"power_min_w ({self.power_min_w}) is above power_max_w ({self.power_max_w})")
        return self


class Build(_Strict):
    """[builds.NAME]: one engine install. Exactly one of python / binary / image."""

    engine: str  # any registered engine (the `servedeck.engines` entry points); checked where the file is loaded
    python: Optional[str] = None  # a venv's interpreter; the engine runs as `python -m ...`
    binary: Optional[str] = None  # an executable such as llama-server
    image: Optional[str] = None  # a container image, run with `docker run`
    env: dict[str, str] = Field(default_factory=dict)
    requires: list[str] = Field(default_factory=list)  # paths the install needs (e.g. symlinks FlashInfer assumes)
    shm_size: str = "64g"  # docker --shm-size
    docker: str = "docker"  # the container CLI for image builds
    notes: str = ""

    @model_validator(mode="after")
    def _one_kind(self) -> "Build":
        given = [k for k in ("python", "binary", "image") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                "a build needs exactly one of python (a venv interpreter), binary (an executable) "
                f"or image (a container image); got {', '.join(given) if given else 'none'}"
            )
        return self

    @property
    def kind(self) -> str:
        return "python" if self.python else "binary" if self.binary else "image"


# The front door's replica routing policies (door/policy.py's POLICIES, which a test holds equal to
# this) and the `routing` keys each one takes besides `policy`.
ROUTING_KNOBS: dict[str, tuple[str, ...]] = {
    "least-outstanding": (),
    "session": ("header", "imbalance", "prefix_chars"),
    "prefix": ("imbalance", "prefix_chars"),
}


class Routing(_Strict):
    """[models.NAME] routing: how the front door spreads a replicated model's requests (docs/door.md).
    `routing = "prefix"` is short for `routing = { policy = "prefix" }`; a knob left out keeps its default."""

    policy: str = "least-outstanding"
    header: Optional[str] = Field(default=None, min_length=1)  # session: the request header naming the conversation (default x-session-id)
    imbalance: Optional[int] = Field(default=None, ge=0)  # outstanding requests above the least loaded (default 4)
    prefix_chars: Optional[int] = Field(default=None, gt=0)  # characters of the opening read (default 16384)

    @model_validator(mode="before")
    @classmethod
    def _short(cls, v: Any) -> Any:
        return {"policy": v} if isinstance(v, str) else v

    @field_validator("policy")
    @classmethod
    def _policy(cls, v: str) -> str:
        if v not in ROUTING_KNOBS:
            raise ValueError(f"no routing policy named {v!r}; choose one of: {', '.join(ROUTING_KNOBS)}")
        return v

    @model_validator(mode="after")
    def _knobs(self) -> "Routing":
        stray = sorted(k for k in self.model_fields_set - {"policy"}
                       if getattr(self, k) is not None and k not in ROUTING_KNOBS[self.policy])
        if stray:
            takes = ", ".join(ROUTING_KNOBS[self.policy]) or "no other key"
            raise ValueError(f"{', '.join(stray)} does nothing for policy {self.policy!r} (it takes {takes}); "
                             "remove it or pick the policy it belongs to")
        return self


class ClientDefaults(_Strict):
    """[models.NAME] client_defaults: what the front door fills in when a client leaves it out, for chat and
    completions. A chat UI sends no max_tokens (a base model then writes until its context is full) and offers
    its own tools by default (thousands of prompt tokens). A value the client sends always wins; `tools = false`
    removes the tools a client offers, so the model answers in text (docs/door.md#client-defaults)."""

    max_tokens: Optional[int] = None  # when the body has neither max_tokens nor max_completion_tokens
    temperature: Optional[float] = Field(default=None, ge=0, le=2)
    top_p: Optional[float] = Field(default=None, gt=0, le=1)
    stop: Optional[Union[str, list[str]]] = None
    tools: bool = True  # false: drop tools, tool_choice, parallel_tool_calls (and the older functions) a client offers

    @field_validator("max_tokens")
    @classmethod
    def _max_tokens(cls, v: Optional[int]) -> Optional[int]:
        return int_range(v, 1, INT32_MAX, "tokens: engines read it as a 32-bit integer")

    @field_validator("stop")
    @classmethod
    def _stop(cls, v: Any) -> Any:
        if v is not None and (v == "" or v == [] or (isinstance(v, list) and "" in v)):
            raise ValueError("stop has an empty string: write the text that ends an answer, e.g. "
                             'stop = ["<|im_end|>"], or remove stop')
        return v

    def fill(self, body: dict[str, Any], chat: bool) -> list[str]:
        """Fill `body` (a chat or completions request) in place; the keys the door set or removed, in order."""
        done: list[str] = []
        if self.max_tokens is not None and body.get("max_tokens") is None and body.get("max_completion_tokens") is None:
            body["max_tokens"] = self.max_tokens
            done.append("max_tokens")
        for key in ("temperature", "top_p", "stop"):
            value = getattr(self, key)
            if value is not None and body.get(key) is None:
                body[key] = value
                done.append(key)
        if chat and not self.tools:
            for key in ("tools", "tool_choice", "parallel_tool_calls", "functions", "function_call"):
                if key in body:
                    del body[key]
                    done.append(f"-{key}")
        return done

    @property
    def empty(self) -> bool:
        return self == ClientDefaults()


class Model(_Strict):
    """[models.NAME]: one model as the deck serves it."""

    source: str  # HF repo id, local directory or .gguf file
    build: str
    port: int
    slot: str = "main"
    aliases: list[str] = Field(default_factory=list)
    context: Optional[int] = None
    # independent servers of this model, NAME.r1 … NAME.rN, on port, port + 1, …; the front door and
    # `servedeck bench NAME` spread requests over them (fewest outstanding first). Declared before
    # gpus / cpus: their validator reads it.
    replicas: int = 1  # 1 to MAX_PARALLEL (_counts)
    # with replicas > 1: one list per replica (gpus = [[0], [1]]); load.py expands the entry into replicas
    gpus: Union[list[int], list[list[int]]] = Field(default_factory=list)
    cpus: Union[list[int], list[list[int]]] = Field(default_factory=list)  # CPU set (affinity / --cpuset-cpus)
    # the memory (NUMA) nodes of a container's CPUs (--cpuset-mems), written `cpus = { set = ..., mems = ... }`
    # (split_cpu_table); unset: the nodes of those CPUs on the host that renders the launch
    cpu_mems: Union[list[int], list[list[int]]] = Field(default_factory=list)
    gpu_memory_utilization: Optional[float] = None
    tp: int = 1  # tensor parallel size; tp, dp, pp: 1 to MAX_PARALLEL (_counts)
    dp: int = 1  # data parallel size
    pp: int = 1  # pipeline parallel size
    args: dict[str, ArgValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    served_name: Optional[str] = None  # the name clients send; defaults to the model's name
    host: str = "127.0.0.1"
    host_ram_gib: Optional[float] = Field(default=None, gt=0)
    # the most output tokens servedeck's own requests ask for (gate, bench, soak, readiness); rendered as
    # llama.cpp's -n (the length of a request that names none); vLLM and SGLang have no such flag
    max_output_tokens: Optional[int] = None  # 1 to INT32_MAX (_output)
    vision: bool = False  # a multimodal model: shown in status; llama.cpp needs `mmproj`
    mmproj: Optional[str] = None  # llama.cpp's multimodal projector GGUF (--mmproj), for vision = true
    # tool calling (the door passes `tools` through): llama.cpp `true` (--jinja: it reads the call format
    # from the chat template); vLLM and SGLang the name of their tool-call parser ("hermes", "llama3_json", …)
    tools: Union[bool, str] = False
    chat_template: Optional[str] = None  # a Jinja chat template file used instead of the model's own
    # serves /v1/embeddings (and only that): llama.cpp --embeddings, vLLM --runner pooling, SGLang --is-embedding
    embeddings: bool = False
    stop_timeout_s: float = Field(default=120.0, gt=0)  # SIGTERM grace before SIGKILL, as the seed's unit
    # `servedeck unit`'s Restart= (systemd's values; seed 004's units say always)
    unit_restart: str = "on-failure"
    ready_timeout_s: float = Field(default=900.0, gt=0)
    ttl: Optional[float] = None  # the front door stops the model after this long without requests
    # "auto" | 1 | 2 | false: whether a switch (and the door) puts the model to sleep rather than stopping it,
    # at which level; sleeping is rendered into its launch (docs/config.md#sleep)
    sleep: Union[bool, int, str] = False
    ttl_sleep: Optional[float] = None  # the front door puts the model to sleep after this long without requests
    routing: Routing = Field(default_factory=Routing)  # the front door's choice of replica per request
    # merged into the body of every request servedeck itself sends (gate, bench, readiness, soak),
    # e.g. { chat_template_kwargs = { enable_thinking = false } } for a reasoning model
    request: dict[str, Any] = Field(default_factory=dict)
    # what the front door fills in for a client that leaves it out (max_tokens, temperature, top_p, stop) and
    # whether a client's tools reach the model: { max_tokens = 512, tools = false } (ClientDefaults)
    client_defaults: ClientDefaults = Field(default_factory=ClientDefaults)
    notes: str = ""
    # the user's reason per flag, env var or key, shown beside it, or beside its absence, on `servedeck page`:
    # why = { "kv-cache-dtype" = "on anyway: the checkpoint declares an fp8 KV scheme" }
    why: dict[str, str] = Field(default_factory=dict)

    @field_validator("why")
    @classmethod
    def _why(cls, v: dict[str, str]) -> dict[str, str]:
        """Keys as the user names the thing (`kv-cache-dtype`, `--kv-cache-dtype`, `HF_HUB_OFFLINE`,
        `gpu_memory_utilization`); a flag's dashes are dropped so both spellings are one key."""
        out: dict[str, str] = {}
        for key, reason in v.items():
            name = key.strip().lstrip("-")
            if not name:
                raise ValueError(f"why: the key {key!r} names nothing; write the flag, env var or key the reason is for")
            if not reason.strip():
                raise ValueError(f"why.{key}: the reason is empty; say why, or remove the entry")
            if name in out:
                raise ValueError(f"why: {key!r} and another key name the same flag {name!r}; keep one")
            out[name] = reason.strip()
        return out

    @field_validator("request")
    @classmethod
    def _request(cls, v: dict[str, Any]) -> dict[str, Any]:
        owned = sorted(set(v) & REQUEST_OWNED)
        if owned:
            raise ValueError(f"request sets {', '.join(owned)}, which servedeck sets itself for each request "
                             f"(it owns {', '.join(sorted(REQUEST_OWNED))}); remove "
                             f"{'it' if len(owned) == 1 else 'them'} from the request table")
        return v

    @field_validator("sleep", mode="before")
    @classmethod
    def _sleep(cls, v: Any) -> Any:
        if v is False or v == "auto" or (v in (1, 2) and not isinstance(v, bool)):
            return v
        if v is True:
            raise ValueError('sleep = true does not say how: write sleep = "auto" (level 1 when host memory '
                             "holds the weights, else 2), 1, 2, or false")
        raise ValueError(f'sleep must be "auto", 1, 2 or false, got {v!r}')

    @field_validator("ttl", "ttl_sleep", mode="before")
    @classmethod
    def _ttl(cls, v: Any, info: ValidationInfo) -> Optional[float]:
        """Seconds, or a duration as people type it ("90s", "10m", "1h")."""
        if v is None:
            return None
        if isinstance(v, str):
            from servedeck.errors import ServedeckError
            from servedeck.timeparse import seconds

            try:
                v = seconds(v, info.field_name)
            except ServedeckError as e:
                raise ValueError(f"{e.message} (write it like 90, 90s, 10m or 1h)") from None
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0:
            raise ValueError(f"{info.field_name} must be a positive duration (seconds or e.g. \"10m\"), got {v!r}")
        return duration(float(v))

    @field_validator("tools")
    @classmethod
    def _tools(cls, v: Union[bool, str]) -> Union[bool, str]:
        if isinstance(v, str) and not v.strip():
            raise ValueError('tools is an empty string: write the engine\'s tool-call parser (vLLM, SGLang: '
                             'tools = "hermes"), or tools = true on llama.cpp')
        return v

    @model_validator(mode="after")
    def _embeddings_alone(self) -> "Model":
        if self.embeddings and self.tools:
            raise ValueError("embeddings = true serves /v1/embeddings only, where tools do nothing; "
                             "remove tools, or serve the model for chat in an entry of its own")
        return self

    @model_validator(mode="after")
    def _sleep_times(self) -> "Model":
        if self.ttl_sleep is not None and self.sleep is False:
            raise ValueError("ttl_sleep puts the model to sleep, but sleep = false; set sleep = \"auto\" (or 1, 2), "
                             "or remove ttl_sleep")
        if self.ttl_sleep is not None and self.ttl is not None and self.ttl_sleep >= self.ttl:
            raise ValueError(f"ttl_sleep ({self.ttl_sleep:g} s) is not shorter than ttl ({self.ttl:g} s): the model "
                             "would be stopped before it slept; make ttl_sleep shorter, or remove it")
        return self

    @field_validator("port")
    @classmethod
    def _port(cls, v: int) -> int:
        if not 1 <= v <= 65535:
            raise ValueError(f"port {v} is out of range (expected 1-65535)")
        return v

    @field_validator("context")
    @classmethod
    def _context(cls, v: Optional[int]) -> Optional[int]:
        if v is not None and v <= 0:
            raise ValueError(f"context must be a positive integer number of tokens (1 to {INT32_MAX}), got {v}")
        return int_range(v, 1, INT32_MAX, "tokens: engines read it as a 32-bit integer")

    @field_validator("max_output_tokens")
    @classmethod
    def _output(cls, v: Optional[int]) -> Optional[int]:
        return int_range(v, 1, INT32_MAX, "tokens: engines read it as a 32-bit integer")

    @field_validator("replicas", "tp", "dp", "pp")
    @classmethod
    def _counts(cls, v: int, info: ValidationInfo) -> int:
        return int_range(v, 1, MAX_PARALLEL, "servers" if info.field_name == "replicas" else "GPUs")

    @field_validator("unit_restart")
    @classmethod
    def _restart(cls, v: str) -> str:
        if v not in UNIT_RESTART:
            raise ValueError(f"{v!r} is not one of systemd's Restart= values: {', '.join(UNIT_RESTART)}")
        return v

    @field_validator("stop_timeout_s", "ready_timeout_s")
    @classmethod
    def _timeouts(cls, v: float) -> float:
        return duration(v)

    @field_validator("gpu_memory_utilization")
    @classmethod
    def _util(cls, v: Optional[float]) -> Optional[float]:
        if v is not None and not 0 < v <= 1:
            raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {v}")
        return v

    @model_validator(mode="before")
    @classmethod
    def _cpu_table(cls, data: Any) -> Any:
        return split_cpu_table(data)

    @field_validator("cpu_mems")
    @classmethod
    def _mems(cls, v: list, info: ValidationInfo) -> list:
        """Memory nodes go with CPUs, one list per replica as they do; nodes may repeat across replicas."""
        if not v:
            return v
        cpus = info.data.get("cpus")
        nested = isinstance(v[0], list)
        if not cpus:
            raise ValueError("memory nodes without CPUs: write cpus = { set = [...], mems = [...] }")
        if nested != isinstance(cpus[0], list) or (nested and len(v) != len(cpus)):
            raise ValueError(f"one list of memory nodes per list of CPUs: cpus {cpus}, mems {v}")
        if any(n < 0 for n in ([x for p in v for x in p] if nested else v)):
            raise ValueError(f"memory nodes are NUMA node numbers >= 0, got {v}")
        return v

    @field_validator("gpus", "cpus")
    @classmethod
    def _sets(cls, v: list, info: ValidationInfo) -> list:
        """One flat list, or with replicas > 1 one list per replica; distinct across all."""
        key = info.field_name
        what = "GPU indices" if key == "gpus" else "CPU numbers"
        replicas = info.data.get("replicas", 1)
        nested = bool(v) and isinstance(v[0], list)
        if replicas == 1 and nested:
            raise ValueError(f"one list per replica only goes with replicas > 1; with one server "
                             f"write a single list, like {key} = {v[0]}")
        if replicas > 1 and v and not nested:
            raise ValueError(f"replicas = {replicas} needs one list per replica, like "
                             f"{key} = {[[i] for i in range(replicas)]}, got {v}")
        if nested and len(v) != replicas:
            raise ValueError(f"{len(v)} lists given for replicas = {replicas} (one per replica)")
        flat = [x for part in v for x in part] if nested else list(v)
        if any(x < 0 for x in flat) or len(set(flat)) != len(flat):
            raise ValueError(f"{key} must be distinct {what} >= 0" + (" (across replicas)" if nested else "")
                             + f", got {v}")
        return v

    @property
    def layout(self) -> str:
        """tp1 / dp4 / tp2dp2: how the model is spread, as run folders name it."""
        parts = [f"{k}{n}" for k, n in (("tp", self.tp), ("dp", self.dp), ("pp", self.pp)) if n > 1]
        return "".join(parts) or "tp1"


class ModelsToml(_Strict):
    """What models.toml holds, validated: the host, its builds and its models (a replicated entry not yet
    expanded). Not the deck itself: that is `servedeck.deck.Deck`, the operations on what runs."""

    host: Host = Field(default_factory=Host)
    builds: dict[str, Build] = Field(default_factory=dict)
    models: dict[str, Model] = Field(default_factory=dict)

