#!/usr/bin/env bash
# Issue 33 on one H200: model swaps through the door with vLLM's sleep mode, against cold switches in the
# same run (bench/sleep_switch.py). vLLM 0.26.0 installed with --target into $SITE (docs: the device recipe
# in /work/shared/device/vllm-0.26-cu130.md), the image's python3 (3.12, torch 2.11+cu130).
#
# Run in the repo root on the device:
#   OUT=/some/dir MODELS="/models/a /models/b [/models/c]" bash scripts/gpu-sleep.sh
# or let it write random-weight models of Llama-3-8B's shape first (transformers, bf16: ~20 s and 15 GiB
# each; figures are speeds, answers are deterministic nonsense, so "identical after a wake" still checks):
#   OUT=/some/dir TOKENIZER=/path/to/smollm2-hf RANDOM_MODELS=3 bash scripts/gpu-sleep.sh
# Knobs (defaults): PYTHON=python3 SITE=/tmp/site CONTEXT=8192 UTIL=0.9 MAX_NUM_SEQS=64 ALTERNATIONS=20
#   COLD_REPS=2 ROTATION_ROUNDS=1 PHASES=sleep,rotation,cold SLEEP_RAM_GIB=(1.5 x the weights) WORK=/tmp/sleep-gpu
#   ARGS_1, ARGS_2, ARGS_3: more of model i's args, as TOML (ARGS_2='kv-cache-dtype = "fp8"'), so that each
#   model's first boot also checks the planner against another KV layout
# Writes $OUT/sleep_switch.json (after every phase), $OUT/sleep.log, the doors' logs and the deck's journal.
# Wall time with two 8B models: two first boots (~140 s, then ~70 s once vLLM's compile cache is warm),
# 20 sleep switches (~1 s each), 2 cold switches (~80 s each); the rotation adds a third boot. Split it
# over calls with PHASES (each phase brings the deck to its own starting point).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-$repo/gpu-sleep-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/sleep.log") 2>&1
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
site=${SITE:-/tmp/site}
work=${WORK:-/tmp/sleep-gpu}
mkdir -p "$work"
export PYTHONPATH="$site:$repo/src${PYTHONPATH:+:$PYTHONPATH}"

echo "=== host [$(date -u +%FT%TZ)]"
nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader || { echo "not a GPU host"; exit 2; }
free -g | head -2
"$py" -c 'import vllm, sys; print("vllm", vllm.__version__, "python", sys.version.split()[0])' \
  || { echo "no vLLM importable from $site"; exit 2; }
"$py" -c 'import servedeck, pydantic, typer, rich, psutil, httpx, httptools, aiohttp, filelock, platformdirs, pynvml, prometheus_client' \
  || { echo "servedeck's own packages are missing: carry their wheels (scripts/_device_venv.sh's .whl/)"; exit 2; }

models=()
if [ -n "${MODELS:-}" ]; then
  # shellcheck disable=SC2206  # a list of folders, split on spaces
  models=($MODELS)
elif [ -n "${RANDOM_MODELS:-}" ]; then
  [ -d "${TOKENIZER:-}" ] || { echo "set TOKENIZER to a folder with tokenizer.json (SmolLM2's HF folder)"; exit 2; }
  for i in $(seq 1 "$RANDOM_MODELS"); do
    d=$work/random-llama3-8b-$i
    [ -f "$d/config.json" ] || "$py" "$repo/scripts/make-random-hf.py" "$d" --tokenizer-from "$TOKENIZER" --seed "$i" \
      --context "${CONTEXT:-8192}" || { echo "cannot write $d"; exit 2; }
    models+=("$d")
  done
else
  echo "set MODELS (two or three HF model folders) or RANDOM_MODELS=2|3 with TOKENIZER"; exit 2
fi
[ "${#models[@]}" -ge 2 ] && [ "${#models[@]}" -le 3 ] || { echo "two or three models, got ${#models[@]}"; exit 2; }

config=$work/models.toml
cat >"$config" <<TOML
# written by scripts/gpu-sleep.sh; bench/sleep_switch.py sets sleep (and [host] sleep_ram_gib) per phase
[host]
min_residency_s = 0

[builds.vllm]
engine = "vllm"
python = "$(command -v "$py")"
env = { PYTHONPATH = "$site", VLLM_USE_FLASHINFER_SAMPLER = "0" }
TOML
names=()
for i in "${!models[@]}"; do
  n=m$((i + 1))
  names+=("$n")
  cat >>"$config" <<TOML

[models.$n]
source = "${models[$i]}"
build = "vllm"
port = $((8201 + i))
slot = "main"
context = ${CONTEXT:-8192}
gpus = [0]
gpu_memory_utilization = ${UTIL:-0.9}
args = { max-num-seqs = ${MAX_NUM_SEQS:-64}$(v=ARGS_$((i + 1)); [ -n "${!v:-}" ] && echo ", ${!v}") }
TOML
done
cat "$config"
list=$(IFS=,; echo "${names[*]}")
extra=()
[ -n "${SLEEP_RAM_GIB:-}" ] && extra+=(--rotation-sleep-ram-gib "$SLEEP_RAM_GIB")

echo "=== bench/sleep_switch.py --models $list [$(date -u +%FT%TZ)]"
"$py" "$repo/bench/sleep_switch.py" --config "$config" --models "$list" --alternations "${ALTERNATIONS:-20}" \
  --cold-reps "${COLD_REPS:-2}" --rotation-rounds "${ROTATION_ROUNDS:-1}" --phases "${PHASES:-sleep,rotation,cold}" \
  --home "$work/home" --out "$OUT/sleep_switch.json" "${extra[@]}"
rc=$?
cp "$work"/home/journal.jsonl "$OUT/journal.jsonl" 2>/dev/null || true
cp /tmp/sleep-switch-*/door-*.log "$OUT/" 2>/dev/null || true
for d in "$work"/home/launches/*/*/; do  # each launch's output check and command, small files only
  m=$(basename "$(dirname "$d")"); s=$(basename "$d")
  mkdir -p "$OUT/launches/$m/$s"
  cp "$d"/cmd.sh "$d"/launch.json "$d"/boot.json "$d"/sleep_reference.jsonl "$d"/wake_check.json "$OUT/launches/$m/$s/" 2>/dev/null || true
  tail -200 "$d/engine.log" >"$OUT/launches/$m/$s/engine.tail.log" 2>/dev/null || true
done
nvidia-smi --query-gpu=index,memory.used --format=csv,noheader
echo "=== done: exit $rc [$(date -u +%FT%TZ)]"
exit $rc
