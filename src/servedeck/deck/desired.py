"""The desired-state codec: a model's settings as desired.json keeps them (secrets redacted), and the
one-model configuration rebuilt from them for `restore` and the watch loop's relaunch (secrets taken
back from the current models.toml or the environment)."""

from __future__ import annotations

import os
from pathlib import Path

from servedeck import paths
from servedeck.config import Build, Config, Group, Model, ModelsToml
from servedeck.deck import state as S
from servedeck.errors import StateError
from servedeck.redact import REDACTED, redact_env, redact_settings_args


def settings_of(name: str, cfg: Config) -> dict:
    m = cfg.models[name]
    b = cfg.deck.builds[m.build]
    model = m.model_dump(mode="json")
    model["env"] = redact_env(m.env)
    model["args"] = redact_settings_args(model.get("args") or {})
    build = b.model_dump(mode="json")
    build["env"] = redact_env(b.env)
    out = {"model": model, "build_name": m.build, "build": build, "config_path": str(cfg.path),
           "since": S.now_iso()}
    group = cfg.group_of(name)
    if group:  # a relaunch must know its siblings share the slot with it
        out["replica_of"] = {"name": group.name, "members": list(group.members)}
    return out

def config_from_settings(name: str, settings: dict, current: Config | None) -> Config:
    """Rebuild the one-model config a launch was made with; secrets come from the current config or env."""

    def fill(env: dict, current_env: dict, where: str) -> dict:
        out = {}
        for k, v in env.items():
            if v == REDACTED:
                if k in current_env:
                    v = current_env[k]
                elif k in os.environ:
                    v = os.environ[k]
                else:
                    raise StateError(f"desired.json: models.{name}: secret {where}.env.{k} is not stored",
                                     hint=f"set {k} in the environment or in models.toml, then run again")
            out[k] = v
        return out

    def fill_args(args: dict, current_args: dict) -> dict:
        out = {}
        for k, v in args.items():
            if v == REDACTED:
                if k not in current_args:
                    raise StateError(f"desired.json: models.{name}: secret args.{k} is not stored",
                                     hint=f"put args.{k} back in models.toml for models.{name}, then run again")
                v = current_args[k]
            out[k] = v
        return out

    problem = S.settings_problem(settings)
    if problem:
        path = paths.desired_file()
        raise StateError(f"{path}: models.{name}: {problem}; it cannot be started from it",
                         hint=f"`servedeck stop {name}` drops it from desired state, or restore "
                              f"{path.with_suffix('.json.bak')}")
    cur_m = current.models.get(name) if current else None
    cur_b = current.deck.builds.get(settings["build_name"]) if current else None
    model = dict(settings["model"])
    build = dict(settings["build"])
    model["env"] = fill(model.get("env", {}), dict(cur_m.env) if cur_m else {}, f"models.{name}")
    model["args"] = fill_args(model.get("args", {}), dict(cur_m.args) if cur_m else {})
    build["env"] = fill(build.get("env", {}), dict(cur_b.env) if cur_b else {}, f"builds.{settings['build_name']}")
    deck = ModelsToml(builds={settings["build_name"]: Build(**build)}, models={name: Model(**model)})
    groups = {}
    if settings.get("replica_of"):
        g = settings["replica_of"]
        m = deck.models[name]
        groups[g["name"]] = Group(g["name"], tuple(g["members"]), (), m.served_name or g["name"], m.slot, None)
    return Config(path=Path(settings.get("config_path", "desired.json")), deck=deck, groups=groups)


def settings_diff(name: str, settings: dict, current: Config | None) -> list[dict]:
    """Where the settings `name` was launched with (desired.json) and its models.toml entry now differ:
    one {key, desired, config} per key path as models.toml spells it (`context`, `args.parallel`,
    `builds.llamacpp.binary`), secrets compared redacted on both sides. [] when models.toml has no
    such model (nothing to compare) or they agree. Notes are left out: they launch nothing."""
    if current is None or name not in current.models or S.settings_problem(settings):
        return []
    now = settings_of(name, current)
    out: list[dict] = []

    def walk(a: object, b: object, key: str) -> None:
        if isinstance(a, dict) and isinstance(b, dict):
            for k in sorted(set(a) | set(b), key=str):
                if not key and k == "notes":
                    continue
                walk(a.get(k), b.get(k), f"{key}.{k}" if key else str(k))
        elif a != b:
            out.append({"key": key, "desired": a, "config": b})

    walk(settings.get("model") or {}, now["model"], "")
    build = settings.get("build_name", "")
    if build == now["build_name"]:  # a model moved to another build says so in its `build` key
        walk(settings.get("build") or {}, now["build"], f"builds.{build}")
    return out
