"""The campaign file: one TOML file declaring launches (variants × repeats) and workloads.

Validated like models.toml: every problem names the file, the key path and what was expected;
unknown keys are refused; nothing starts while anything is wrong. `parse` is pure (text in,
CampaignFile out); `variants()` expands `[matrix]` into named variants.

    [campaign]     name, model (a models.toml model or alias), cell_timeout, repeats, gate, base, reference,
                   reference_run (stop a launch whose outputs differ from that run's), retries (--ray: node-loss
                   retries)
    [[variants]]   name + overrides of the model's entry (build, args, env, context, gpus, cpus, tp, dp, pp,
                   gpu_memory_utilization, replicas), host (--ray: which node), outputs_may_differ (its greedy
                   outputs may differ from the `reference` variant's and it may still be recommended)
    [matrix]       "args.max-num-seqs" = [64, 128]: every combination becomes a variant named after its values
    [[workloads]]  kind = any workload kind (workloads/kinds.py), the keys every kind takes (below, as
                   `servedeck bench`'s options), and the keys of its own, declared, checked and turned
                   into what it sends by its module (docs/campaign.md lists them). With a `reference`, the
                   first one answers the output check; when its kind cannot (a capacity search, a ramp, ...),
                   `parse` puts OUTPUT_CHECK first, so a named reference is never left unchecked
    [slo.NAME]     thresholds, like ttft_p95 = "2s", error_rate = "1%" (servedeck.slo)
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Optional, Union

from pydantic import (BaseModel, ConfigDict, Field, StrictBool, ValidationError, create_model, field_validator,
                      model_validator)

from servedeck.config.schema import ArgValue, split_cpu_table
from servedeck.config.tomlfile import problems as validation_lines
from servedeck.config.tomlfile import read_toml
from servedeck.errors import ConfigError, UsageError
from servedeck.slo import slo_of_table
from servedeck.timeparse import seconds
from servedeck.workloads.kinds import KINDS, keys as kind_keys, misplaced
from servedeck.workloads.shape import Entry



# keys a variant may override, and where a [matrix] key may point
OVERRIDABLE = ("build", "args", "env", "context", "gpus", "cpus", "tp", "dp", "pp", "gpu_memory_utilization",
               "replicas", "host")
# the workload put first when the campaign names a `reference` and its own first workload's kind does not answer
# the output check: one short request besides the check's prompts (a capacity-only campaign with a reference
# once compared nothing, and its table said "not checked" while the recommendation took any variant)
OUTPUT_CHECK = {"kind": "chat", "label": "output check", "concurrency": [1], "requests": 1, "warmup": 0,
                "input_tokens": 64, "output_tokens": 4}
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._=+,-]*$")
Sets = Union[list[int], list[list[int]]]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class NeedleCfg(_Strict):
    """The needle (gates/niah.py). context 0/absent: what the server serves per request."""

    context: int = Field(default=0, ge=0)
    depths: list[float] = Field(default_factory=lambda: [0.1, 0.5, 0.9])
    repeats: int = Field(default=1, ge=1)
    threshold: float = Field(default=0.67, ge=0, le=1)
    seed: Optional[int] = None

    @field_validator("depths")
    @classmethod
    def _depths(cls, v: list[float]) -> list[float]:
        if not v or any(not 0 <= d <= 1 for d in v):
            raise ValueError(f"depths must be fractions between 0 and 1, got {v}")
        return v


class EvalCfg(_Strict):
    """An accuracy gate (gates/kinds.py): questions from `path` (a JSONL file, relative to the campaign
    file), or an lm-eval `task` ("lm-eval:NAME", its YAML in `task_dir`)."""

    path: Optional[str] = None
    task: Optional[str] = None
    task_dir: Optional[str] = None
    threshold: float = Field(ge=0, le=1)
    limit: Optional[int] = Field(default=None, ge=1)
    concurrency: int = Field(default=8, ge=1)
    answer_tokens: int = Field(default=32, ge=1)

    @model_validator(mode="after")
    def _one(self) -> "EvalCfg":
        if (self.path is None) == (self.task is None):
            raise ValueError('give one of path = "questions.jsonl" or task = "lm-eval:NAME"')
        if self.task is not None and not self.task.startswith("lm-eval:"):
            raise ValueError(f'task {self.task!r}: write it like "lm-eval:NAME"')
        if self.task_dir is not None and self.task is None:
            raise ValueError("task_dir is for an lm-eval task, not a question file")
        return self

    @property
    def ref(self) -> str:
        return self.task or self.path or ""


class GateCfg(NeedleCfg):
    """Runs first on every launch: the needle (its keys here, or in `niah`; `niah = false` for none),
    then the accuracy gate `eval` if given."""

    niah: Optional[Union[NeedleCfg, Literal[False]]] = None
    eval: Optional[EvalCfg] = None

    @model_validator(mode="after")
    def _where(self) -> "GateCfg":
        flat = self.model_fields_set & set(NeedleCfg.model_fields)
        if self.niah is not None and flat:
            raise ValueError(f"the needle's keys go in niah = {{...}} or directly in gate, not both "
                             f"(found {', '.join(sorted(flat))} beside niah)")
        return self

    @property
    def needle(self) -> Optional[NeedleCfg]:
        if self.niah is False:
            return None
        return self.niah or NeedleCfg(**{k: getattr(self, k) for k in NeedleCfg.model_fields})


class Head(_Strict):
    name: str
    model: str
    cell_timeout: str = "30m"
    repeats: int = Field(default=1, ge=1)
    gate: Union[GateCfg, Literal[False]] = Field(default_factory=GateCfg)
    base: Optional[str] = None  # the variant others are compared with (default: the first)
    reference: Optional[str] = None  # issue 10: variant whose outputs the others are compared with
    # the output check behind `reference`: how many of its 8 fixed prompts, and the answer room of each
    reference_prompts: int = Field(default=8, ge=1, le=8)
    reference_tokens: int = Field(default=128, ge=1)
    # a run folder (its path, or its name under the results' runs) whose outputs.jsonl each launch's output check is
    # held against as soon as it is answered: a launch whose greedy outputs differ (its variant not
    # outputs_may_differ) ends there, failed, its other workloads never started. `servedeck tune` sets it to the
    # starter's run, so a trial that changes the answers costs a boot and 8 prompts, not a capacity search
    reference_run: Optional[str] = Field(default=None, min_length=1)
    # `campaign run --ray`: a cell whose node is lost mid-cell is retried this many times on another node
    retries: int = Field(default=1, ge=0)
    # derived entries take the ports after the base model's, starting this many further on: `tune --ray` runs
    # trials side by side, each its own one-variant campaign, and two on one host must not bind the same port
    port_offset: int = Field(default=0, ge=0)

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v) or "__" in v:
            raise ValueError(f"{v!r} is not a usable name: letters, digits and . _ = + , - only, no '__'")
        return v

    @model_validator(mode="after")
    def _reference_run(self) -> "Head":
        if self.reference_run is not None and self.reference is None:
            raise ValueError("reference_run needs reference = \"VARIANT\": without it no launch answers the output "
                             "check that reference_run is held against")
        return self

    @field_validator("cell_timeout")
    @classmethod
    def _timeout(cls, v: str) -> str:
        try:
            s = seconds(v, "cell_timeout")
        except Exception:
            raise ValueError(f"{v!r} is not a duration (write it like 90s, 30m or 2h)") from None
        if s <= 0:
            raise ValueError("cell_timeout must be above 0")
        return v

    @property
    def cell_timeout_s(self) -> float:
        return seconds(self.cell_timeout, "cell_timeout")


class Variant(_Strict):
    """One launch: overrides of the base model's models.toml entry."""

    name: str
    build: Optional[str] = None
    args: dict[str, ArgValue] = Field(default_factory=dict)
    env: dict[str, str] = Field(default_factory=dict)
    context: Optional[int] = Field(default=None, gt=0)
    gpus: Optional[Sets] = None  # one list (one replica) or one list per replica
    cpus: Optional[Sets] = None  # also in models.toml's table form, { set = ..., mems = ... } (config.schema)
    cpu_mems: Optional[Sets] = None  # the memory nodes that table names (a container's --cpuset-mems)
    tp: Optional[int] = Field(default=None, ge=1)
    dp: Optional[int] = Field(default=None, ge=1)
    pp: Optional[int] = Field(default=None, ge=1)
    gpu_memory_utilization: Optional[float] = Field(default=None, gt=0, le=1)
    replicas: int = Field(default=1, ge=1)
    # `campaign run --ray`: the node this variant's cells run on (a Ray custom resource, a node label
    # value or a host name); ignored without --ray
    host: Optional[str] = Field(default=None, min_length=1)
    # issue 47: greedy outputs that differ from the `reference` variant's do not keep it from being recommended
    # (a user who accepts another model's answers, say); not an override of the model's entry
    outputs_may_differ: StrictBool = False

    @model_validator(mode="before")
    @classmethod
    def _cpu_table(cls, data: Any) -> Any:
        return split_cpu_table(data)

    @field_validator("outputs_may_differ", mode="before")
    @classmethod
    def _may_differ(cls, v: Any) -> Any:
        if not isinstance(v, bool):
            raise ValueError(f"expected true or false (a TOML boolean, no quotes), got {v!r}: write "
                             "outputs_may_differ = true to let this variant be recommended though its greedy "
                             "outputs differ from the reference variant's")
        return v

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        if not _NAME.match(v) or "__" in v or "@" in v:
            raise ValueError(f"{v!r} is not a usable variant name: letters, digits and . _ = + , - only, "
                             "no '__' (it becomes part of run folder names)")
        return v

    @model_validator(mode="after")
    def _sets(self) -> "Variant":
        for key in ("gpus", "cpus"):
            sets = getattr(self, key)
            if sets is None or not sets or not isinstance(sets[0], list):
                if self.replicas > 1 and sets:
                    raise ValueError(f"{key}: replicas = {self.replicas} needs one list per replica, like "
                                     f"{key} = [[0], [1]]; got {sets}")
                continue
            if len(sets) != self.replicas:
                raise ValueError(f"{key}: {len(sets)} lists given for replicas = {self.replicas} (one per replica)")
            flat = [c for s in sets for c in s]
            if any(c < 0 for c in flat) or len(set(flat)) != len(flat):
                raise ValueError(f"{key}: replicas must get distinct indices >= 0, got {sets}")
        return self

    def overrides(self) -> dict[str, Any]:
        """The keys this variant sets on the model's entry, as the file wrote them."""
        return {k: v for k, v in self.model_dump(mode="json", exclude_unset=True).items()
                if k not in ("name", "outputs_may_differ")}

    def sets(self, key: str) -> list[list[int]]:
        """gpus/cpus per replica ([] each when unset)."""
        v = getattr(self, key)
        if not v:
            return [[] for _ in range(self.replicas)]
        return [list(s) for s in v] if isinstance(v[0], list) else [list(v)]


class _Workload(_Strict):
    """One [[workloads]] entry: a run per launch, as `servedeck bench` would make it. The keys here every kind
    takes; `WorkloadCfg` adds each kind's own (workloads/kinds.py)."""

    kind: Literal[tuple(KINDS)]  # type: ignore[valid-type]
    concurrency: Optional[list[int]] = None
    rate: Optional[list[float]] = None
    arrivals: Literal["poisson", "constant"] = "poisson"
    input_tokens: int = Field(default=1024, ge=16)
    output_tokens: Optional[int] = Field(default=None, ge=1)
    prompt_tokens: Optional[int] = Field(default=None, ge=16)
    duration: Optional[str] = None
    requests: Optional[int] = Field(default=None, ge=1)
    warmup: int = Field(default=1, ge=0)
    seed: Optional[int] = None
    client_procs: int = Field(default=1, ge=1)  # the load spread over this many client processes (first replica)
    waves: Optional[int] = Field(default=None, ge=1)  # closed loops: requests a stream (as `--waves`)
    label: Optional[str] = None

    @model_validator(mode="after")
    def _shape(self) -> "_Workload":
        wrong = misplaced(self)  # another kind's keys
        if wrong:
            raise ValueError(wrong)
        KINDS[self.kind].check_entry(self)  # its own keys' rules
        if self.concurrency and self.rate:
            raise ValueError("concurrency and rate are two different load shapes: give one")
        for key in ("concurrency", "rate"):
            v = getattr(self, key)
            if v is not None and (not v or any(x <= 0 for x in v)):
                raise ValueError(f"{key}: every value must be above 0, got {v}")
        if self.duration is not None:
            try:
                seconds(self.duration, "duration")
            except Exception:
                raise ValueError(f"duration {self.duration!r} is not a duration (like 60s)") from None
        if self.waves is not None and (self.duration is not None or self.requests is not None or self.rate):
            raise ValueError("waves sizes each closed-loop point by its requests (waves × concurrency): give it "
                             "without duration, requests or rate")
        return self

    @property
    def title(self) -> str:
        return self.label or self.kind


WorkloadCfg = create_model(  # type: ignore[call-overload]
    "WorkloadCfg", __base__=_Workload, __doc__=_Workload.__doc__,
    **{k.name: (k.type, Field(default_factory=list) if k.default == [] else k.default) for k in kind_keys().values()})


class CampaignFile(_Strict):
    campaign: Head
    variants: list[Variant] = Field(default_factory=list)
    matrix: dict[str, list[ArgValue]] = Field(default_factory=dict)
    workloads: list[WorkloadCfg] = Field(default_factory=list)
    slo: dict[str, dict[str, str]] = Field(default_factory=dict)  # [slo.NAME]: figure = limit

    @field_validator("matrix")
    @classmethod
    def _matrix(cls, v: dict[str, list[Any]]) -> dict[str, list[Any]]:
        for key, values in v.items():
            head = key.split(".")[0]
            if head not in OVERRIDABLE or head in ("replicas", "host") and "." in key:
                raise ValueError(f"{key!r}: a matrix key is one of {', '.join(OVERRIDABLE)} "
                                 "(args.NAME and env.NAME for one flag or variable)")
            if head in ("args", "env") and "." not in key:
                raise ValueError(f"{key!r}: name the flag or variable, like \"args.max-num-seqs\"")
            if not values:
                raise ValueError(f"{key!r}: give at least one value")
        return v


@dataclass(frozen=True)
class Campaign:
    """A validated campaign file with its variants expanded."""

    path: Path
    text: str
    file: CampaignFile
    variants: tuple[Variant, ...]
    knobs: dict[str, dict[str, Any]] = field(default_factory=dict)  # variant → {"args.x": v} from [matrix]

    @property
    def name(self) -> str:
        return self.file.campaign.name

    @property
    def head(self) -> Head:
        return self.file.campaign

    def variant(self, name: str) -> Variant:
        return next(v for v in self.variants if v.name == name)

    @property
    def slos(self) -> dict[str, Any]:
        """[slo.NAME] tables, parsed (servedeck.slo.SloSpec by name)."""
        return {name: slo_of_table(name, table) for name, table in self.file.slo.items()}

    @property
    def base_variant(self) -> Optional[str]:
        return self.head.base or (self.variants[0].name if self.variants else None)


def _value_label(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, (list, dict)):
        return re.sub(r"[^A-Za-z0-9.+-]", "", str(v))
    return re.sub(r"[^A-Za-z0-9.+-]", "-", str(v))


def expand_matrix(matrix: dict[str, list[Any]]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """Pure: every combination → (variant name, its overrides, its knobs). Name: `leaf=value,...`."""
    if not matrix:
        return []
    keys = list(matrix)
    out = []
    for combo in itertools.product(*(matrix[k] for k in keys)):
        overrides: dict[str, Any] = {}
        for key, value in zip(keys, combo):
            head, _, leaf = key.partition(".")
            if leaf:
                overrides.setdefault(head, {})[leaf] = value
            else:
                overrides[head] = value
        name = ",".join(f"{k.split('.')[-1]}={_value_label(v)}" for k, v in zip(keys, combo))
        out.append((name, overrides, dict(zip(keys, combo))))
    return out


def knobs_of(variant: Variant) -> dict[str, Any]:
    """Flattened overrides, e.g. {"args.parallel": 4, "replicas": 2}: what a report compares."""
    out: dict[str, Any] = {}
    for k, v in variant.overrides().items():
        if isinstance(v, dict):
            out.update({f"{k}.{leaf}": x for leaf, x in v.items()})
        else:
            out[k] = v
    return out


def parse(text: str, path: Path, raw: Optional[dict[str, Any]] = None) -> Campaign:
    """Pure: the file's text → a Campaign, or ConfigError naming every problem (file: key path: what). `raw`:
    the tables already read from `text` and reshaped (a tune file's trial: tune/file.py)."""
    raw = read_toml(text, path) if raw is None else raw
    try:
        cf = CampaignFile.model_validate(raw)
    except ValidationError as e:
        lines = validation_lines(e, f"{path}: ", CampaignFile)
        raise ConfigError("\n".join(lines), hint="fix each key named above as its line says") from None
    first: Any = cf.workloads[0] if cf.workloads else None  # WorkloadCfg is made at import: mypy cannot see it
    if cf.campaign.reference is not None and first is not None and not KINDS[first.kind].answers_output_check:
        cf = cf.model_copy(update={"workloads": [WorkloadCfg.model_validate(OUTPUT_CHECK), *cf.workloads]})
    variants, knobs = list(cf.variants), {}
    for v in cf.variants:
        knobs[v.name] = knobs_of(v)
    problems = []
    for name, overrides, kn in expand_matrix(cf.matrix):
        try:
            variants.append(Variant.model_validate({"name": name, **overrides}))
            knobs[name] = kn
        except ValidationError as e:
            problems += validation_lines(e, f"matrix: combination {name}: ", Variant)
    if not variants:
        problems.append("variants: no variants and no [matrix]: add at least one [[variants]] (name = \"base\" "
                        "with no overrides launches the model as models.toml has it)")
    names = [v.name for v in variants]
    for n in sorted({n for n in names if names.count(n) > 1}):
        problems.append(f"variants: name {n!r} is used twice (variant names must be unique)")
    if not cf.workloads:
        problems.append(f"workloads: no [[workloads]]: add at least one (kind = one of {', '.join(KINDS)})")
    for name, table in cf.slo.items():  # each [slo.NAME] parses
        try:
            slo_of_table(name, table)
        except UsageError as e:
            problems.append(e.message)
    where = Entry(base=path.parent, slos=cf.slo)
    for i, w in enumerate(cf.workloads):  # what a kind checks across the file (a trace read whole, SLOs named)
        problems += KINDS[w.kind].file_problems(w, i, where)
    for key in ("base", "reference"):
        ref = getattr(cf.campaign, key)
        if ref is not None and ref not in names:
            problems.append(f"campaign.{key}: no variant named {ref!r} (variants: {', '.join(names)})")
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems), hint="each line names the key to fix")
    return Campaign(path=path, text=text, file=cf, variants=tuple(variants), knobs=knobs)


def load(path: Path) -> Campaign:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such campaign file", hint="give the path of a campaign .toml "
                          "([campaign] names it and its model, [[variants]] each launch, [[workloads]] what is run)") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    return parse(text, path.resolve())
