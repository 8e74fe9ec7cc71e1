# Sourced by scripts/gpu-vllm.sh on the H200 device (step 3 of docs/gpu-vllm.md), after every part reached
# /tmp/vllm-parts (scripts/vllm-device-receive.sh): assemble and check the bundle, install its wheels into
# /tmp/site (pip --target, hashes checked, the image's own packages left alone), and make the models. Each
# step is skipped when an earlier call on this still-warm machine did it. Needs: py, repo, step (a function).
# Sets: PYTHONPATH (servedeck's checkout and /tmp/site), VLLM_USE_FLASHINFER_SAMPLER=0 (its sampler JIT-compiles
# kernels and the image has no toolchain for it), models=/tmp/vllm-models with r8b/ and smollm2/ in it, and
# engine_py (the interpreter that runs vLLM: $py itself on the device; ENGINE_PYTHON in a rehearsal).
parts=/tmp/vllm-parts
bundle=/tmp/vllm-bundle
models=/tmp/vllm-models
r8b_shape=""
if [ "${DEVICE_DRY:-0}" = 1 ]; then  # a rehearsal (gpu-vllm.sh): PYTHON has vLLM already; no bundle, tiny models
  bundle=/tmp/vllm-dry-bundle models=/tmp/vllm-dry-models
  smol_hf=$("$repo/scripts/prepare-models.sh" | sed -n 's/^smollm2_hf=//p')
  smol_gguf=$("$repo/scripts/prepare-models.sh" | sed -n 's/^smollm2_gguf=//p')
  mkdir -p "$bundle/smollm2-tokenizer" && cp "$smol_hf"/tokenizer* "$smol_hf"/chat_template.jinja "$bundle/smollm2-tokenizer/"
  ln -sf "$smol_gguf" "$bundle/smollm2-135m-instruct-q4_1.gguf"
  touch "$bundle/.ok"
  r8b_shape="--layers 2 --hidden 256 --heads 4 --kv-heads 2 --ffn 512"
fi
if [ ! -f "$bundle/.ok" ]; then
  step "assemble the bundle"
  [ -f "$parts/MANIFEST" ] || { echo "no parts received: run scripts/vllm-device-receive.sh calls first"; exit 2; }
  missing=$(grep -o 'part-[0-9]*$' "$parts/MANIFEST" | while read -r f; do [ -f "$parts/$f" ] || echo "$f"; done)
  [ -z "$missing" ] || { echo "parts still missing: $missing"; exit 2; }
  want=$(awk '$2 == "bundle.tar" {print $1}' "$parts/MANIFEST")
  got=$(cat "$parts"/part-* | sha256sum | cut -d' ' -f1)
  [ "$want" = "$got" ] || { echo "the assembled bundle's sha256 is $got, MANIFEST says $want"; exit 2; }
  rm -rf "$bundle" && mkdir -p "$bundle"
  cat "$parts"/part-* | tar -x -C "$bundle" --strip-components=1 || exit 2
  touch "$bundle/.ok"
fi
if [ ! -f /tmp/site/.ok ] && [ "${DEVICE_DRY:-0}" != 1 ]; then
  step "install the wheels into /tmp/site"
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --require-hashes \
    --find-links "$bundle/wheels" -r "$bundle/lock.txt" --target /tmp/site || exit 2
  touch /tmp/site/.ok
fi
# servedeck's code: the checkout's src, or a snapshot of a commit carried in .device/snap (made by
# `git archive COMMIT src | tar -x -C .device/snap`), so a call runs committed code while the tree has edits
src=$repo/src
if [ -d "$repo/.device/snap/src" ]; then src=$repo/.device/snap/src; echo "servedeck from .device/snap: $(cat "$repo/.device/snap/COMMIT" 2>/dev/null)"; fi
export PYTHONPATH="$src:/tmp/site${PYTHONPATH:+:$PYTHONPATH}" PATH="/tmp/site/bin:$PATH"
export VLLM_USE_FLASHINFER_SAMPLER=0 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
engine_py=${ENGINE_PYTHON:-$py}  # the same python3 on the device; a rehearsal may run vLLM from another venv
[ "$engine_py" = "$py" ] || export PYTHONPATH="$src"
"$engine_py" -c 'import torch, vllm; print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  || { echo "vLLM does not import: see above"; exit 2; }
"$py" -c 'from servedeck.cli import root_app' || { echo "servedeck does not import: see above"; exit 2; }
mkdir -p "$models"
if [ ! -f "$models/r8b/.complete" ] && [ "${SKIP_R8B:-0}" != 1 ]; then
  step "random-weight model of Llama-3-8B's shape (bf16, SmolLM2's tokenizer): speeds and memory, never answers"
  "$engine_py" "$repo/scripts/make-random-hf.py" "$models/r8b" --tokenizer-from "$bundle/smollm2-tokenizer" ${r8b_shape:-} || exit 2
fi
if [ ! -f "$models/smollm2/.complete" ] && [ "${SKIP_SMOL:-0}" != 1 ]; then
  step "SmolLM2-135M-Instruct, real weights (GGUF dequantized; served in bf16)"
  "$engine_py" "$repo/scripts/gguf_to_hf.py" "$bundle/smollm2-135m-instruct-q4_1.gguf" "$models/smollm2" \
    --tokenizer-from "$bundle/smollm2-tokenizer" || exit 2
fi
