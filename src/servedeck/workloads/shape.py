"""The one shape every workload kind has: its registry entry (`Kind`), the campaign-file keys (`Key`) and
`servedeck bench` options (`Option`) it declares, and where a campaign file's entry is read (`Entry`).

A kind's module builds one `Kind` and `workloads/kinds.py` lists it in `KINDS` (an outside package: a
`servedeck.workloads` entry point). What the entry says, the rest of servedeck does for every kind alike:

    options, from_options    `servedeck bench --workload NAME` (its options added to the command): parsed
                             option values → the spec, every rule that needs no server checked before any launch
    keys, check_entry,       a campaign file's `kind = "NAME"`: its own [[workloads]] keys (the shared ones are
    file_problems,           campaign/file.py's), refused with a message naming the key (`check_entry`, a
    from_entry               ValueError; pydantic adds the path), across the file (`file_problems`), → its specs
    fitted, run              on the server (workloads/session.py opens the run folder, gates, then calls these):
                             `fitted` checks the spec against the served context and sizes what fills it; `run`
                             measures into the folder, inside the telemetry sampler, and says whether it failed
    point_figures, view,     its figures for the report, rebuilt from the folder's records whenever a run is read
    describe, figures,       (runs/read.py) and rendered (report/render.py: its workload line, its figures,
    head/tail_sections,      sections of its own, its line in `servedeck runs`); `curve`: where its points go in
    headline, curve          the cross-run report ("load": against load; "length": against prompt length)

A spec (what one run sends) is plain data; its kind is `spec.kind`, a name in `KINDS`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Optional

Options = Mapping[str, Any]  # `servedeck bench`'s option values by parameter name (every kind's, merged)
View = dict[str, Any]  # a run as runs/read.py rebuilds it


@dataclass(frozen=True)
class Key:
    """A [[workloads]] key of a kind's own: its name, its type as pydantic reads it, and its default (None: the
    kind's own default applies; a key is "given" when its value is not None and not [])."""

    name: str
    type: Any
    default: Any = None


@dataclass(frozen=True)
class Option:
    """A `servedeck bench` option: the parameter its value arrives as, its flags, its type (an Enum gives the
    choices), its default and its help. Kinds that share an option share this object (workloads/options.py)."""

    param: str
    flags: tuple[str, ...]
    type: Any
    default: Any
    help: str


@dataclass(frozen=True)
class Entry:
    """Where a campaign file's [[workloads]] entry is read: the campaign file's folder (a file named in it is
    relative to it), the file's [slo.NAME] tables, the output check the campaign's `reference` asks of its first
    workload ((prompts, tokens), or None), and whether files it names are read now (not for `campaign plan`)."""

    base: Path = Path(".")
    slos: Mapping[str, Any] = field(default_factory=dict)
    output_check: Optional[tuple[int, int]] = None
    read_files: bool = True


def _nothing(*_: Any) -> None:
    return None


def _no_problems(*_: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class Kind:
    """One workload kind, as `KINDS` lists it (the module docstring says what each field is for)."""

    name: str
    help: str  # one line for `--workload`'s help
    options: tuple[Option, ...]
    from_options: Callable[[Options], Any]
    from_entry: Callable[[Any, Entry], list[Any]]  # one spec per run folder (a capacity search: one per SLO)
    fitted: Callable[[Any, Any, int], Any]  # (spec, target, served context) → the spec to run; UsageError if not
    run: Callable[[Any, Any, int, Any, Any], Awaitable[Optional[str]]]  # (spec, target, ctx, folder, reporter)
    keys: tuple[Key, ...] = ()
    check_entry: Callable[[Any], None] = _nothing
    file_problems: Callable[[Any, int, Entry], list[str]] = _no_problems  # (entry, its index, where)
    # first in a campaign with a `reference`, its run answers the fixed output-check prompts (Entry.output_check);
    # a campaign whose first workload's kind does not puts a one-request chat run first that does (campaign/file.py)
    answers_output_check: bool = False
    # an option of its own that, given to `servedeck bench`, makes this the kind that runs (the --workload
    # chosen is then what it sends: a capacity search's `--find`)
    takes_over: Optional[str] = None
    command: Optional[tuple[str, str]] = None  # a command of its own beside `bench` (name, help): `servedeck ramp`
    owns: Optional[Callable[[Mapping[str, Any]], bool]] = None  # a summary's workload entry is this kind's
    # figures
    point_figures: Optional[Callable[[list[Any]], tuple[dict[str, Any], dict[str, Any]]]] = None  # → (figures, headline)
    view: Optional[Callable[[Path, View, list[Any]], dict[str, Any]]] = None  # (folder, view, records) → view keys
    describe: Optional[Callable[[Mapping[str, Any]], str]] = None  # the workload entry → summary.md's line
    figures: Optional[Callable[[View, str], list[str]]] = None  # its figures in place of the load-point tables
    head_sections: Optional[Callable[[View], list[str]]] = None  # before the figures
    tail_sections: Optional[Callable[[View], list[str]]] = None  # after them
    headline: Optional[Callable[[View], str]] = None  # `servedeck runs`' line of figures
    curve: Optional[str] = "load"  # None: as the kind its points are (a capacity search's steps)
