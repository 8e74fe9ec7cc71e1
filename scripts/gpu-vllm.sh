#!/usr/bin/env bash
# Step 3 of vLLM on the H200 device (docs/gpu-vllm.md), run THERE once the parts are in (scripts/vllm-device-
# receive.sh): installs vLLM 0.26.0 (CUDA 13) into /tmp/site, makes the models, and runs one phase of servedeck
# against it, from this checkout. One phase per device call (each well inside the call's 10 minutes); the
# deck's state (/tmp/gpu-vllm/home) and the results (/tmp/gpu-vllm/results) carry over between calls while the
# machine stays warm, so do the calls back to back.
#
#   OUT=$OUT bash scripts/gpu-vllm.sh core      doctor's build row, the planner against r8b's boot (bf16), `gpu`
#                                               mapping its memory, a second model refused, servedeck's bench
#                                               beside `vllm bench serve` at 1, 16, 64, 256 streams with vLLM's
#                                               own histograms for both (bench/vllm_side_by_side.py)
#   OUT=$OUT bash scripts/gpu-vllm.sh sleep     sleep-mode switches through the door: two 8B-shape models in one
#                                               slot, 20 alternations, against cold switches; a 3-model rotation
#                                               (scripts/gpu-sleep.sh); the planner against fp8 KV and
#                                               --kv-cache-memory-bytes boots
#   OUT=$OUT bash scripts/gpu-vllm.sh smol      SmolLM2-135M, real weights: a campaign (plain against n-gram
#                                               speculation, reference outputs compared token by token, the gate,
#                                               a capacity search) that recommends a variant; the EngineCore and
#                                               the API server killed under `servedeck watch`
#   OUT=$OUT bash scripts/gpu-vllm.sh capacity  plain SmolLM2's capacity search alone (CAPACITY_PROCS="1 4": client
#                                               processes per search), under the smol campaign's SLO
#   OUT=$OUT bash scripts/gpu-vllm.sh routing   replicas = 2 of SmolLM2 on one GPU: the door's `prefix` against
#                                               vllm-router's `cache_aware` (bench/routing_side_by_side.py)
#
# Models (scripts/_device_vllm.sh): r8b, random weights of Llama-3-8B's shape in bf16 (speeds and memory,
# never answers; its gate fails, as it must) and SmolLM2-135M-Instruct with its real weights in bf16.
# Writes under $OUT: PHASE.log and PHASE.tar.gz (every JSON, table, run and campaign folder the phase made),
# plus the phase's main tables as files of their own.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
phase=${1:?usage: gpu-vllm.sh core|sleep|smol|routing|again|capacity}
OUT=${OUT:-$repo/gpu-vllm-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/$phase.log") 2>&1
base=/tmp/gpu-vllm
out=$base/out/$phase
mkdir -p "$base/home" "$base/results" "$out"
export SERVEDECK_HOME=$base/home SERVEDECK_RESULTS=$base/results SERVEDECK_CONFIG=$base/models.toml
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
t0=$(date +%s)
step() { echo; echo "=== $* [$(date -u +%FT%TZ), +$(( $(date +%s) - t0 )) s, load $(cut -d' ' -f1 /proc/loadavg)]"; }
sd() { "$py" -m servedeck "$@"; }
left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); echo $(( l > 30 ? l : 30 )); }  # seconds of the call's budget left (30 at least)
pack() {
  step "pack"
  sd status --json >"$out/status-end.json" 2>/dev/null
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv >"$out/gpu-apps-end.csv" 2>&1
  # the launches' own files (cmd.sh, boot.json, launch.json, engine.log), the runs and campaigns of this phase
  tar -czf "$OUT/$phase.tar.gz" -C "$base" "out/$phase" home/launches home/journal.jsonl results 2>/dev/null
  ls -la "$OUT"
}
trap pack EXIT

step "host"
# DEVICE_DRY=1: a rehearsal on a host without a GPU (vLLM's CPU build as PYTHON, tiny models), so that a script
# error costs no device time; the figures mean nothing there.
dry=${DEVICE_DRY:-0}
nvidia-smi -L || [ "$dry" = 1 ] || { echo "no nvidia-smi: not a GPU host"; exit 2; }
echo "$(nproc) CPUs, $(free -g | awk '/Mem:/ {print $2}') GiB"
. "$here/_device_vllm.sh"
engine_env='PYTHONPATH = "/tmp/site", VLLM_USE_FLASHINFER_SAMPLER = "0", HF_HUB_OFFLINE = "1"'
[ "$dry" = 1 ] && engine_env='VLLM_CPU_KVCACHE_SPACE = "1", HF_HUB_OFFLINE = "1"'

cat >"$SERVEDECK_CONFIG" <<TOML
# Written by scripts/gpu-vllm.sh on the device: the image's python3 runs vLLM from /tmp/site (pip --target).
[builds.vllm-cuda]
engine = "vllm"
python = "$(command -v "$engine_py")"
env = { $engine_env }

[models.r8b]
source = "$models/r8b"
build = "vllm-cuda"
port = 8100
slot = "main"
context = 8192
gpus = [0]
gpu_memory_utilization = 0.9
args = { max-num-seqs = 256 }
notes = "random weights, Llama-3-8B shape: figures are speeds and memory, never answers"

[models.smol]
source = "$models/smollm2"
build = "vllm-cuda"
port = 8200
slot = "small"
context = 8192
gpus = [0]
gpu_memory_utilization = 0.25
args = { dtype = "bfloat16", max-num-seqs = 256 }  # issue 47: the capacity search must have room past c=32
notes = "SmolLM2-135M-Instruct, real weights (dequantized from its Q4_1 GGUF), bf16"
TOML

case "$phase" in
core)
  step "doctor: the build row finds vLLM through the build's PYTHONPATH (issue 32, 2b)"
  sd doctor r8b --json >"$out/doctor-r8b.json"
  "$py" - "$out/doctor-r8b.json" <<'PY' | tee "$out/doctor-r8b.txt"
import json, sys
for r in json.load(open(sys.argv[1]))["rows"]:
    print(r["check"], r.get("subject") or "", r["status"], r.get("saw") or "", sep=" | ")
PY
  step "plan (nothing starts)"
  sd plan r8b | tee "$out/plan-r8b.txt"
  sd plan r8b --json >"$out/plan-r8b.json"
  step "start r8b (the build's env sets PYTHONPATH; the supervisor keeps servedeck's: issue 32, 2a)"
  s=$(date +%s%N)
  sd start r8b || exit 2
  echo "ready after $(( ($(date +%s%N) - s) / 1000000 )) ms"
  sd status --json >"$out/status-r8b.json"
  sd gpu | tee "$out/gpu-r8b.txt"
  sd gpu --json >"$out/gpu-r8b.json"
  nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv | tee "$out/gpu-apps-r8b.csv"
  step "the planner against the boot"
  sd plan r8b | tee "$out/plan-r8b-after-boot.txt"
  if [ "$dry" != 1 ]; then  # without a GPU nothing is refused for memory: the rehearsal would boot it
    step "a second model while r8b holds the GPU: refused, naming the holder"
    sd start smol 2>&1 | tee "$out/refused-smol.txt"
  fi
  step "servedeck's bench beside vllm bench serve, vLLM's histograms deciding (issue 32, 2c)"
  timeout -s INT "$(left 555)" "$py" "$repo/bench/vllm_side_by_side.py" --config "$SERVEDECK_CONFIG" --model r8b \
    --concurrency "${CONCURRENCY:-1,16,64,256}" ${DURATION:+--duration "$DURATION"} --waves "${WAVES:-3}" \
    --arms servedeck,vllm-bench --vllm-python "$engine_py" --out "$out/vllm_side_by_side_h200.json" \
    | tee "$OUT/vllm_side_by_side.txt"
  if [ $(( 540 - ($(date +%s) - t0) )) -gt 90 ]; then
    step "the same with per-chunk usage asked of vLLM, as servedeck asks: does it cost the server?"
    timeout -s INT "$(left 540)" "$py" "$repo/bench/vllm_side_by_side.py" --config "$SERVEDECK_CONFIG" --model r8b \
      --concurrency 64,256 --waves "${WAVES:-3}" --arms vllm-bench-ccu --vllm-python "$engine_py" \
      --out "$out/vllm_side_by_side_h200_ccu.json" | tee -a "$OUT/vllm_side_by_side.txt"
  fi
  step "stop"
  sd stop --all
  ;;
sleep)
  sd stop --all >/dev/null 2>&1
  # Three models of r8b's weights under three names (what a swap moves is their size, not their values):
  # m1 as core's r8b (vLLM's compile cache is warm for it), m2 with a fixed 20 GiB KV pool, m3 with fp8 KV,
  # so each first boot also checks the planner against another KV layout. SLEEP_PHASES splits the bench
  # over calls: "sleep" (20 alternations) in one, "rotation,cold" in the next.
  step "sleep-mode switches through the door (scripts/gpu-sleep.sh, phases ${SLEEP_PHASES:-sleep})"
  MODELS="$models/r8b $models/r8b $models/r8b" MAX_NUM_SEQS=256 ARGS_2='kv-cache-memory-bytes = 21474836480' \
    ARGS_3='kv-cache-dtype = "fp8"' PHASES=${SLEEP_PHASES:-sleep} PYTHON=$engine_py WORK=$base/sleep OUT=$out \
    timeout -s INT "$(left 540)" bash "$here/gpu-sleep.sh"
  cp "$out/sleep_switch.json" "$OUT/sleep_switch_${SLEEP_PHASES:-sleep}.json" 2>/dev/null
  step "the planner against each boot of this phase (bf16, a fixed KV pool, fp8 KV)"
  for m in m1 m2 m3; do
    SERVEDECK_HOME=$base/sleep/home sd --config "$base/sleep/models.toml" plan "$m" | tee -a "$out/plans.txt"
    SERVEDECK_HOME=$base/sleep/home sd --config "$base/sleep/models.toml" plan "$m" --json >"$out/plan-$m.json"
  done
  case "${SLEEP_PHASES:-sleep}" in  # the models stay up for the next call's phases, until the cold one
    *cold*) SERVEDECK_HOME=$base/sleep/home sd --config "$base/sleep/models.toml" stop --all ;;
  esac
  ;;
smol)
  sd stop --all >/dev/null 2>&1
  cat >"$base/smol-campaign.toml" <<'TOML'
[campaign]
name = "h200-smol-spec"
model = "smol"
cell_timeout = "4m"
gate = { context = 4096 }
reference = "plain"            # every launch answers the fixed greedy prompts, compared token by token with plain's

[[variants]]
name = "plain"

[[variants]]
name = "ngram"
args = { speculative-config = { method = "ngram", num_speculative_tokens = 3, prompt_lookup_max = 4 } }

[slo.interactive]
ttft_p90 = "250ms"
tpot_p90 = "15ms"

[[workloads]]
kind = "chat"
concurrency = [1, 16]
input_tokens = 512
output_tokens = 128
duration = "6s"

[[workloads]]
kind = "capacity"
find = "max-concurrency"
slo = ["interactive"]
max = 256                      # issue 47: room past c=32 (at e246aa0 ngram was capped at 32, plain stopped at 16)
input_tokens = 512
output_tokens = 128
duration = "4s"
TOML
  step "campaign: plain against n-gram speculation, gate, reference outputs, capacity"
  # KILLS=0 leaves out the kills under watch below (they ran on 2026-12-06) and gives the campaign their time
  timeout -s INT "$(left "$([ "${KILLS:-1}" = 0 ] && echo 575 || echo 380)")" "$py" -m servedeck campaign run "$base/smol-campaign.toml"
  echo "(campaign exit $?)"
  folder=$(ls -d "$SERVEDECK_RESULTS"/campaigns/h200-smol-spec__* 2>/dev/null | tail -1)
  if [ -n "$folder" ]; then
    cp "$folder/campaign.md" "$OUT/smol-campaign.md" 2>/dev/null
    sd campaign status "$folder" --json >"$out/campaign-status.json"
    sd report "$folder" --out "$out/report" >/dev/null 2>&1 && echo "report: $out/report"
  fi
  [ "${KILLS:-1}" = 0 ] && { sd stop --all; exit 0; }
  step "kill the EngineCore, then the API server, under the watch loop"
  sd start smol || exit 2
  sd watch --interval 2s >"$out/watch.log" 2>&1 &
  watch_pid=$!
  "$py" "$here/_device_kill_watch.py" smol "$out/kills.json"
  kill "$watch_pid" 2>/dev/null; wait "$watch_pid" 2>/dev/null
  sd crashes smol | tee "$out/crashes-smol.txt"
  sd crashes smol --json >"$out/crashes-smol.json"
  sd notices --since 30m >"$out/notices.txt" 2>&1
  sd stop --all
  ;;
again)
  # A second machine after the first went back mid-session: r8b again for the contested points of the
  # side by side (64 and 256 streams, both tools on one schedule: WAVES requests a stream), then the sleep alternations again with the level-1 wake's prefix
  # cache reset, as many as the call leaves time for.
  step "start r8b"
  sd start r8b || exit 2
  step "servedeck's bench beside vllm bench serve at ${CONCURRENCY:-64,256} streams"
  timeout -s INT "$(left 390)" "$py" "$repo/bench/vllm_side_by_side.py" --config "$SERVEDECK_CONFIG" --model r8b \
    --concurrency "${CONCURRENCY:-64,256}" ${DURATION:+--duration "$DURATION"} --waves "${WAVES:-3}" \
    --arms servedeck,vllm-bench --vllm-python "$engine_py" --out "$out/vllm_side_by_side_h200.json" \
    | tee "$OUT/vllm_side_by_side.txt"
  sd stop --all
  [ "${AGAIN_SLEEP:-1}" = 0 ] && exit 0  # the side by side alone
  step "sleep alternations again, the level-1 wake resetting the prefix cache"
  MODELS="$models/r8b $models/r8b" MAX_NUM_SEQS=256 ARGS_2='kv-cache-memory-bytes = 21474836480' \
    PHASES=sleep ALTERNATIONS=${ALTERNATIONS:-6} PYTHON=$engine_py WORK=$base/sleep OUT=$out \
    timeout -s INT "$(left 585)" bash "$here/gpu-sleep.sh"
  cp "$out/sleep_switch.json" "$OUT/sleep_switch_again.json" 2>/dev/null
  SERVEDECK_HOME=$base/sleep/home sd --config "$base/sleep/models.toml" stop --all
  ;;
routing)
  sd stop --all >/dev/null 2>&1
  cat >>"$SERVEDECK_CONFIG" <<TOML

[models.smol2]
source = "$models/smollm2"
build = "vllm-cuda"
port = 8300
slot = "pair"
context = 8192
replicas = 2                    # no gpus key: both replicas on GPU 0 (the seed's DP on one card)
gpu_memory_utilization = 0.35
args = { dtype = "bfloat16", max-num-seqs = 64 }
env = { VLLM_SERVER_DEV_MODE = "1" }  # POST /reset_prefix_cache between arms instead of two boots per arm
TOML
  step "replicas = 2 on one GPU: the door's prefix against vllm-router's cache_aware"
  timeout -s INT "$(left 560)" "$py" "$repo/bench/routing_side_by_side.py" --config "$SERVEDECK_CONFIG" --model smol2 \
    ${ROUTING_ARGS:---between-arms reset --users 64 --turns 8 --system-prompt-tokens 2048 --turn-tokens 256 --answer-tokens 128 --reps 12 --time-budget 4m} \
    --routers door:prefix vllm-router:cache_aware --out "$out/routing_side_by_side_h200_vllm.json" \
    | tee "$OUT/routing.txt"
  sd stop --all
  ;;
capacity)
  # Issue 47: plain SmolLM2's capacity past c=32 with one client process (as the campaign measures it), after
  # 3cceab8 moved each client process's first host reading before the measured clock.
  sd stop --all >/dev/null 2>&1
  step "start smol"
  sd start smol || exit 2
  for procs in ${CAPACITY_PROCS:-1}; do
    step "capacity of plain smol, ${procs} client process(es)"
    timeout -s INT "$(left 540)" "$py" -m servedeck bench smol --find max-concurrency \
      --slo "ttft_p90<=250ms,tpot_p90<=15ms" --max 256 --input-tokens 512 --output-tokens 128 --duration 4s \
      --no-gate --client-procs "$procs" | tee "$OUT/capacity-procs$procs.txt"
  done
  sd stop --all
  ;;
*) echo "unknown phase $phase: core | sleep | smol | routing | again | capacity"; exit 2 ;;
esac
echo "done [$(date -u +%FT%TZ)], $(( $(date +%s) - t0 )) s"
