"""Issue 8 defect 4: every `servedeck …` command that a hint, a crash signature or the docs name exists.

Collected from: backtick-quoted `servedeck …` in every string literal under src/servedeck (hints,
actions, messages, docstrings), all of doctor/signatures.toml, and README.md + docs/*.md (inline code
and fenced code blocks). Each is resolved against the real CLI (its subcommands and options) and run
with `--help` through typer's CliRunner.
"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

from functools import lru_cache
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner

from servedeck.cli import root_app as app

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "servedeck"
QUOTED = re.compile(r"`(servedeck\s[^`]*)`")
HINT_KEYS = {"hint", "action"}
# Backticked text that starts with "servedeck " but names no command, each with why.
NOT_COMMANDS = {
    "servedeck version": "a knob in docs/report.md (servedeck's own version), not a command",
    "servedeck COMMAND --help": "README.md's placeholder for any command's --help, not a command",
}


def _strings(tree: ast.AST):
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    for node in ast.walk(tree):
        if id(node) in inner:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node, node.value
        elif isinstance(node, ast.JoinedStr):  # f-string: placeholders become MODEL
            yield node, "".join(v.value if isinstance(v, ast.Constant) else "MODEL" for v in node.values)


def _hint_strings(tree: ast.AST):
    """Strings given as hint=… / "action": …: the places a user is told what to run."""
    for node in ast.walk(tree):
        vals = []
        if isinstance(node, ast.keyword) and node.arg in HINT_KEYS:
            vals = [node.value]
        elif isinstance(node, ast.Dict):
            vals = [v for k, v in zip(node.keys, node.values)
                    if isinstance(k, ast.Constant) and k.value in HINT_KEYS]
        for v in vals:
            for _, s in _strings(v):
                yield s


@lru_cache(maxsize=1)
def named_commands() -> dict[str, set[str]]:
    """command text → where it was found."""
    found: dict[str, set[str]] = {}

    def add(cmd: str, where: str) -> None:
        cmd = " ".join(cmd.split())
        if cmd not in NOT_COMMANDS:
            found.setdefault(cmd, set()).add(where)

    for f in sorted(SRC.rglob("*.py")):
        tree = ast.parse(f.read_text())
        for _, s in _strings(tree):
            for m in QUOTED.finditer(s):
                add(m.group(1), str(f.relative_to(ROOT)))
    sig = SRC / "doctor" / "signatures.toml"
    for m in QUOTED.finditer(sig.read_text()):
        add(m.group(1), str(sig.relative_to(ROOT)))
    for doc in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = doc.read_text()
        for m in QUOTED.finditer(text):
            add(m.group(1), doc.name)
        for block in re.findall(r"```[a-z]*\n(.*?)```", text, re.S):
            for line in block.splitlines():
                line = line.strip().removeprefix("$ ")
                if line.startswith("servedeck "):
                    add(line.split("  #")[0].split(" # ")[0], doc.name)
    return found


ROOT_CMD = typer.main.get_command(app)  # typer's own click: groups are told by their `commands` table
ROOT_PARAMS = {o: p for p in ROOT_CMD.params for o in (*p.opts, *p.secondary_opts)}
ROOT_OPTS = set(ROOT_PARAMS)
# Root options that act and exit on their own (`servedeck --version`, like `servedeck --help`): each is a
# command by itself.
ROOT_EAGER_FLAGS = {o for o, p in ROOT_PARAMS.items() if getattr(p, "is_flag", False) and p.is_eager}


def resolve(cmd: str) -> tuple[list[str], Any, list[str]]:
    """The subcommand path, the click command it names, and the option names the text uses."""
    words = shlex.split(cmd.replace("|", " ").rstrip("\\ "), posix=True)[1:]
    opts: list[str] = []
    while words and words[0] in ROOT_OPTS:  # `servedeck --config FILE soak ...`, `servedeck --version`
        if getattr(ROOT_PARAMS[words[0]], "is_flag", False):
            if words[0] in ROOT_EAGER_FLAGS:
                opts.append(words[0])
            words = words[1:]
        else:
            words = words[2:]
    group: Any = ROOT_CMD
    path: list[str] = []
    rest = list(words)
    while rest and hasattr(group, "commands"):
        w = rest[0].strip("[]()")
        if w.startswith("-"):
            break
        sub = group.commands.get(w)
        default = getattr(group, "default_command", None)  # `servedeck tune FILE` is `servedeck tune run FILE`
        if sub is None and default in group.commands:
            path.append(default)
            group = group.commands[default]
            continue  # `w` is that subcommand's argument
        if sub is None:
            raise LookupError(f"`servedeck {' '.join(path + [w])}` is not a command")
        path.append(w)
        group = sub
        rest.pop(0)
    for w in rest:
        w = w.strip("[]()").split("=")[0]
        if re.fullmatch(r"--?[a-zA-Z][\w-]*", w):
            opts.append(w)
    return path, group, opts


def test_hints_quote_the_commands_they_name():
    """A hint that names a command quotes it in backticks, so the collector below sees every one."""
    bare = []
    for f in sorted(SRC.rglob("*.py")):
        for s in _hint_strings(ast.parse(f.read_text())):
            unquoted = QUOTED.sub("", s)
            if re.search(r"servedeck [a-z]", unquoted):
                bare.append(f"{f.relative_to(ROOT)}: {s!r}")
    assert not bare, "hints naming a command without backticks:\n" + "\n".join(bare)


def test_the_collector_finds_commands_in_every_kind_of_source():
    found = named_commands()
    assert len(found) > 20
    # a hint in a plain string literal, and the same command in the crash signatures
    assert {"src/servedeck/gpu/modelplan.py", "src/servedeck/doctor/signatures.toml"} <= found["servedeck doctor MODEL"]
    # an f-string's placeholder is read as MODEL (workloads/target.py: f"`servedeck start {name}`")
    assert "src/servedeck/workloads/target.py" in found["servedeck start MODEL"]
    # the docs: inline code and fenced blocks
    assert any("README.md" in where for where in found.values())


@pytest.mark.parametrize("cmd", sorted(named_commands()))
def test_named_command_exists(cmd):
    where = ", ".join(sorted(named_commands()[cmd]))
    try:
        path, command, opts = resolve(cmd)
    except LookupError as e:
        pytest.fail(f"{e} (named in {where})")
    # `servedeck --help` alone is one, and so is `servedeck --version` (a root flag that acts and exits)
    assert path or (opts and set(opts) <= ROOT_EAGER_FLAGS | {"--help"}), f"`{cmd}` names no subcommand (in {where})"
    known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help"}
    unknown = [o for o in opts if o not in known]
    assert not unknown, f"`{cmd}` (in {where}): `servedeck {' '.join(path)}` has no option {unknown}"
    r = CliRunner().invoke(app, [*path, "--help"])
    assert r.exit_code == 0, f"`servedeck {' '.join(path)} --help` failed ({where}): {r.output}"
