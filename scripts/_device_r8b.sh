# Sourced by scripts/gpu-*.sh (after bin is set).
# r8b_model CONFIG CONTEXT PARALLEL: write the random-weight GGUF of Llama-3-8B's shape to $work (figures from
# it are speeds, never answers) and a models.toml at CONFIG naming it as model r8b on `bin`, GPU 0, every layer
# offloaded, with that context and --parallel. Sets r8b (the GGUF's path). Needs: py, repo, work, bin.
r8b_model() {
  local config=$1 context=$2 parallel=$3
  r8b=$work/random-llama3-8b-f16.gguf
  "$py" "$repo/scripts/make-tiny-gguf.py" "$r8b" --layers 32 --hidden 4096 --heads 32 --kv-heads 8 --ffn 14336 \
    --context 131072 --fast || { echo "cannot write the GGUF"; exit 2; }
  cat >"$config" <<TOML
[builds.llamacpp-cuda]
engine = "llamacpp"
binary = "$bin"

[models.r8b]
source = "$r8b"
build = "llamacpp-cuda"
port = 8100
context = $context
gpus = [0]
args = { n-gpu-layers = 999, parallel = $parallel }
notes = "random weights, Llama-3-8B shape: figures are speed, never answers"
TOML
}
