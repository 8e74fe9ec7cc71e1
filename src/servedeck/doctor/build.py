"""Does a build's install match what it says it is? `verify_build(build)` answers for a venv, a binary or an image.

For a venv, every installed distribution's pip RECORD is replayed: each listed file is hashed and compared
(the seed's "24,416 of 24,417 files"), files under the engine's own package that no RECORD lists are
"untracked" (a patched tree copied over a wheel shows up here), and a distribution with no RECORD is named.
The engine's version comes from the package metadata the engine's interpreter would import, read without
starting it: PYTHONPATH's folders first (the build's env, else servedeck's own), then its site-packages.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import json
import os
import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from servedeck.config import Build, Config

_CHUNK = 1 << 20


@dataclass
class RequireCheck:
    path: str
    ok: bool
    saw: str  # "exists", "-> lib (resolves)", "missing", "dangling symlink -> x"


@dataclass
class BuildReport:
    build: str
    kind: str  # python | binary | image
    path: str
    exists: bool
    engine: str
    engine_version: str | None = None
    version_source: str = ""
    site_packages: str | None = None
    dists: int = 0
    files_total: int = 0
    files_matched: int = 0
    changed: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    untracked: list[str] = field(default_factory=list)
    no_record: list[str] = field(default_factory=list)
    editable: list[str] = field(default_factory=list)
    requires: list[RequireCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    integrity_checked: bool = False
    integrity_skip: str = ""

    @property
    def intact(self) -> bool:
        return self.integrity_checked and not self.changed and not self.missing and not self.untracked

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "intact": self.intact}


def record_hash(path: Path) -> str:
    """pip's RECORD form: sha256=<urlsafe base64, no padding>."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(_CHUNK), b""):
            h.update(chunk)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


def venv_root(python: Path) -> Path | None:
    """bin/python → the venv (by its pyvenv.cfg). The path is not resolved: a venv's python is a symlink
    to the base interpreter, and resolving it would leave the venv."""
    root = python.parent.parent
    return root if (root / "pyvenv.cfg").is_file() else None


def site_packages(python: Path) -> Path | None:
    root = venv_root(python)
    if root is not None:
        found = sorted(root.glob("lib/python3*/site-packages")) or sorted(root.glob("lib64/python3*/site-packages"))
        if found:
            return found[-1]
    try:  # not a venv: ask the interpreter itself
        out = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, timeout=30)
        p = Path(out.stdout.strip())
        return p if out.returncode == 0 and p.is_dir() else None
    except (OSError, subprocess.TimeoutExpired):
        return None


def _editable(dist_info: Path) -> bool:
    try:
        return bool(json.loads((dist_info / "direct_url.json").read_text()).get("dir_info", {}).get("editable"))
    except (OSError, ValueError, AttributeError):
        return False


def _records(site: Path) -> tuple[list[tuple[Path, str, str]], list[str], list[str], int]:
    """(rows to hash, dists without RECORD, editable dists, dist count) for one site-packages."""
    rows: list[tuple[Path, str, str]] = []
    no_record, editable = [], []
    dists = sorted(site.glob("*.dist-info"))
    for d in dists:
        rec = d / "RECORD"
        if _editable(d):
            editable.append(d.name)
        if not rec.is_file():
            no_record.append(d.name)
            continue
        with open(rec, newline="") as fh:
            for row in csv.reader(fh):
                if len(row) < 2 or not row[1]:
                    continue  # RECORD itself, .pyc files pip compiled: listed without a hash
                if row[0].endswith(".pyc"):
                    continue  # bytecode a wheel shipped is rewritten by the interpreter; its source is compared
                rows.append((site / row[0], row[1], row[0]))
    return rows, no_record, editable, len(dists)


def check_integrity(report: BuildReport, site: Path, engine_pkg: str | None, workers: int = 8) -> None:
    rows, report.no_record, report.editable, report.dists = _records(site)

    def one(item: tuple[Path, str, str]) -> tuple[str, str]:
        path, want, rel = item
        try:
            return ("ok" if record_hash(path) == want else "changed"), rel
        except FileNotFoundError:
            return "missing", rel
        except OSError:
            return "changed", rel

    with ThreadPoolExecutor(max_workers=workers) as pool:  # hashlib releases the GIL on large reads
        results = list(pool.map(one, rows))
    report.files_total = len(results)
    report.files_matched = sum(1 for r, _ in results if r == "ok")
    report.changed = sorted(rel for r, rel in results if r == "changed")
    report.missing = sorted(rel for r, rel in results if r == "missing")
    if engine_pkg and (site / engine_pkg).is_dir():
        recorded = {os.path.normpath(str(p)) for p, _, _ in rows}
        recorded |= {os.path.normpath(str(site / rel)) for rel in _unhashed(site)}
        for dirpath, dirnames, filenames in os.walk(site / engine_pkg):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for f in filenames:
                full = os.path.normpath(os.path.join(dirpath, f))
                if not f.endswith(".pyc") and full not in recorded:
                    report.untracked.append(os.path.relpath(full, site))
        report.untracked.sort()
    report.integrity_checked = True


def _unhashed(site: Path) -> list[str]:
    """Files RECORD lists without a hash still belong to a distribution (not untracked)."""
    out = []
    for rec in site.glob("*.dist-info/RECORD"):
        with open(rec, newline="") as fh:
            out += [row[0] for row in csv.reader(fh) if row and (len(row) < 2 or not row[1])]
    return out


def check_requires(paths: list[str], expand=lambda s: os.path.expanduser(os.path.expandvars(s))) -> list[RequireCheck]:
    out = []
    for raw in paths:
        p = expand(raw)
        if os.path.islink(p):
            target = os.readlink(p)
            if os.path.exists(p):
                out.append(RequireCheck(raw, True, f"-> {target} (resolves to {os.path.realpath(p)})"))
            else:
                out.append(RequireCheck(raw, False, f"dangling symlink -> {target}"))
        elif os.path.exists(p):
            out.append(RequireCheck(raw, True, "exists"))
        else:
            out.append(RequireCheck(raw, False, "missing"))
    return out


def binary_version(binary: str) -> str | None:
    """`X --version`: llama-server prints `version: 11434 (abcdef)`, or for a build outside git (the sdist)
    `version: 0.6.0-dev (build 0, commit unknown)`, to stderr; the whole statement is kept."""
    try:
        cp = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (cp.stdout + "\n" + cp.stderr).strip()
    m = re.search(r"version:?\s*(\S+(?:\s*\([^)\n]*\))?)", text, re.I)
    return m.group(1) if m else (text.splitlines()[0][:80] if text else None)


def pythonpath_of(build: "Build") -> list[Path]:
    """The folders PYTHONPATH puts before site-packages for the engine's interpreter: the build's own
    `env` sets it, else the engine inherits servedeck's environment's (a vLLM unpacked with
    `pip install --target` is found only there). Used as written: Python does not expand ~ or $VARS in it."""
    raw = build.env["PYTHONPATH"] if "PYTHONPATH" in build.env else os.environ.get("PYTHONPATH", "")
    return [Path(p) for p in raw.split(os.pathsep) if p and Path(p).is_dir()]


def engine_dist(where: Path, dists: tuple[str, ...]) -> tuple[str, str] | None:
    """(distribution name, version) of the first of `dists` installed in the folder `where`."""
    for dist in metadata.distributions(path=[str(where)]):
        dname = (dist.metadata.get("Name") or "").lower().replace("_", "-")
        if dname in dists:
            return dname, dist.version
    return None


def verify_build(build: "Build", name: str = "", cfg: "Config | None" = None, integrity: bool = True) -> BuildReport:
    """Check one [builds.NAME]: exists, version, RECORD integrity (venvs), `requires` paths."""
    expand = cfg.expand if cfg is not None else (lambda s: os.path.expanduser(os.path.expandvars(s)))
    raw = build.python or build.binary or build.image or ""
    path = expand(raw) if build.kind != "image" else raw
    rep = BuildReport(build=name, kind=build.kind, path=path, exists=False, engine=build.engine)
    rep.requires = check_requires(build.requires, expand)
    if build.kind == "image":
        rep.integrity_skip = "a container image: its files are checked by its digest, not pip RECORDs"
        docker = expand(build.docker)
        try:
            cp = subprocess.run([docker, "image", "inspect", "--format", "{{.Id}}", raw],
                                capture_output=True, text=True, timeout=30)
            rep.exists = cp.returncode == 0
            rep.version_source = f"image id {cp.stdout.strip()[:19]}" if rep.exists else ""
            if not rep.exists:
                rep.problems.append(f"{docker} has no image {raw}")
        except (OSError, subprocess.TimeoutExpired) as e:
            rep.problems.append(f"cannot ask {docker} about the image: {e}")
        return rep
    p = Path(path)
    rep.exists = p.exists() and os.access(p, os.X_OK)
    if not rep.exists:
        rep.problems.append(f"{path} {'is not executable' if p.exists() else 'does not exist'}")
        rep.integrity_skip = "the build does not exist"
        return rep
    if build.kind == "binary":
        from servedeck.engines import get_engine

        stated = binary_version(path)
        rep.engine_version = get_engine(build.engine).version(build, stated)
        rep.version_source = "--version" if rep.engine_version == stated else "VERSION file beside the binary"
        rep.integrity_skip = "a binary has no package RECORD (its version is its build id)"
        return rep
    from servedeck.engines import get_engine

    engine = get_engine(build.engine)  # which distributions carry it, and the package they install
    site = site_packages(p)
    if site is None:
        rep.problems.append(f"cannot find site-packages for {path}")
        rep.integrity_skip = "no site-packages found"
        return rep
    rep.site_packages = str(site)
    searched = [*pythonpath_of(build), site]
    for where in searched:
        found = engine_dist(where, engine.dists)
        if found is not None:
            dname, rep.engine_version = found
            rep.version_source = f"{dname} package metadata" + (f" in {where} (PYTHONPATH)" if where != site else "")
            if where != site:  # the engine imports it from there: that install is the one to verify
                rep.site_packages, site = str(where), where
            break
    if rep.engine_version is None:
        rep.problems.append(f"no {'/'.join(engine.dists) or build.engine} distribution in "
                            + " or ".join(str(w) for w in searched))
    if integrity:
        check_integrity(rep, site, engine.package)
    else:
        rep.integrity_skip = "not asked for"
    return rep


def build_version(build: "Build", cfg: "Config | None" = None) -> tuple[str | None, str]:
    """(engine version, where it was read) of a build as installed, without hashing anything: what a launch
    records at its start, so its crash record says what ran even when the engine died before saying it.
    A container image states no version outside itself: its reference (the tag) is recorded."""
    if build.kind == "image":
        return build.image, "image reference"
    rep = verify_build(build, cfg=cfg, integrity=False)
    return rep.engine_version, rep.version_source
