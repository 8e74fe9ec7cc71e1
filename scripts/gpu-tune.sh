#!/usr/bin/env bash
# Issue 51 on the device: `servedeck tune` beside vLLM's own benchmarks/auto_tune, the same model (SmolLM2-135M,
# real weights, bf16), the same latency target (E2E p99 <= 2 s: the one auto_tune knows), the same workload
# (512 tokens in, 128 out), run THERE after the parts are in (docs/gpu-vllm.md:
# scripts/vllm-device-receive.sh, as for gpu-vllm.sh). One phase per device call, back to back:
#
#   OUT=$OUT bash scripts/gpu-tune.sh autotune   auto_tune.sh over max-num-seqs {64, 256} x max-num-batched-tokens
#                                                {2048, 8192}: its memory probe launch and 4 grid launches (~650 s:
#                                                more than one call; it outlives the call as `tune` does, below)
#   OUT=$OUT bash scripts/gpu-tune.sh tune       servedeck tune over the same space: the starter (256, 8192), 2
#                                                searched trials, the best and the starter launched again twice each
#                                                (7 launches, ~1,000 s: more than one call). The tune runs in a
#                                                session of its own (setsid), which the device lets outlive the
#                                                call; each `tune` call starts it or waits on it, and returns before
#                                                the call's limit. Call again, back to back, until it says "tune ended".
#                                                Where it did not outlive a call, the next call resumes the study.
#                                                TRIALS=3 VERIFY=false: auto_tune's launch budget (5 at most; the
#                                                one-machine run of 2026-12-07 took 4 and 560 s)
#   OUT=$OUT bash scripts/gpu-tune.sh grid       servedeck's measurement of auto_tune's four grid points on the
#                                                machine auto_tune just ran on: one campaign, a variant a point, the
#                                                tune's SLO, workload and output check (4 launches; outlives a call)
#   OUT=$OUT bash scripts/gpu-tune.sh outputs    the starter and max-num-seqs = 64 twice each: the output check only
#
# auto_tune.sh is vLLM's file (vllm-project/vllm at 01277f9), carried in .device/auto_tune/ and edited by
# scripts/_auto_tune_edit.py (each edit says why). This script's name and paths hold no "vllm": auto_tune kills
# processes by a pattern on their command lines.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
phase=${1:?usage: gpu-tune.sh autotune|tune|grid|outputs}
OUT=${OUT:-$repo/gpu-tune-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/$phase.log") 2>&1
base=/tmp/gputune
mkdir -p "$base/home" "$base/results"
export SERVEDECK_HOME=$base/home SERVEDECK_RESULTS=$base/results SERVEDECK_CONFIG=$base/models.toml
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
t0=$(date +%s)
step() { echo; echo "=== $* [$(date -u +%FT%TZ), +$(( $(date +%s) - t0 )) s, load $(cut -d' ' -f1 /proc/loadavg)]"; }
left() { local l=$(( ${1:-560} - ($(date +%s) - t0) )); echo $(( l > 30 ? l : 30 )); }
step "host"
nvidia-smi -L || { echo "no nvidia-smi: not a GPU host"; exit 2; }
SKIP_R8B=1
. "$here/_device_vllm.sh"

write_config() {  # the models.toml of the tune and outputs phases
  cat >"$SERVEDECK_CONFIG" <<TOML
# Written by scripts/gpu-tune.sh on the device: the image's python3 runs vLLM from /tmp/site (pip --target).
[builds.cuda]
engine = "vllm"
python = "$(command -v "$engine_py")"
env = { PYTHONPATH = "/tmp/site", VLLM_USE_FLASHINFER_SAMPLER = "0", HF_HUB_OFFLINE = "1" }

[models.smoltune]
source = "$models/smollm2"
build = "cuda"
port = 8400
slot = "tune"
context = 2048
gpus = [0]
gpu_memory_utilization = 0.9
args = { dtype = "bfloat16", max-num-seqs = 256, max-num-batched-tokens = 8192 }
notes = "SmolLM2-135M-Instruct, real weights (dequantized from its Q4_1 GGUF), bf16: the tune's starter"
TOML
}

outlive() {  # NAME COMMAND...: COMMAND in a session of its own (setsid), which the device lets outlive the call:
  # the first call starts it, each call waits on it and shows its new lines, and returns before the call's limit.
  # Sets `ended` to 1 once it has ended (its exit status and time in $base/NAME.exit).
  local name=$1; shift
  local pidf=$base/$name.pid outf=$base/$name.out exitf=$base/$name.exit seen now
  ended=0
  if [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null; then
    step "$name: still running from the last call (pid $(cat "$pidf"))"
  elif [ -f "$exitf" ]; then
    step "$name: already ended ($(cat "$exitf"))"
  else
    step "$name: started in a session of its own"
    setsid bash -c '"$@"; echo "exit $?, $(date -u +%FT%TZ)" >"$0"' "$exitf" "$@" >>"$outf" 2>&1 </dev/null &
    echo $! >"$pidf"
  fi
  seen=$(wc -l <"$outf" 2>/dev/null || echo 0)
  while kill -0 "$(cat "$pidf")" 2>/dev/null && [ "$(left "${WAIT_S:-580}")" -gt 30 ]; do
    sleep 5
    now=$(wc -l <"$outf"); [ "$now" -gt "$seen" ] && sed -n "$((seen + 1)),${now}p" "$outf"; seen=$now
  done
  now=$(wc -l <"$outf"); [ "$now" -gt "$seen" ] && sed -n "$((seen + 1)),${now}p" "$outf"
  if kill -0 "$(cat "$pidf")" 2>/dev/null; then
    echo "$name still running (pid $(cat "$pidf")): call \`gpu-tune.sh $phase\` again, back to back"
  else
    ended=1; echo "$name ended: $(cat "$exitf" 2>/dev/null || echo 'no exit record (it was killed)')"
  fi
}

campaign_body() {  # the campaign head, SLO and workload the tune and the grid share; $1: the campaign's name,
  # $2: more lines of its [campaign] table
  cat <<TOML
[campaign]
name = "$1"${2:+
$2}
model = "smoltune"
cell_timeout = "5m"
gate = { context = 1024, depths = [0.5], repeats = 1 }
reference_prompts = 8
reference_tokens = 32

[slo.e2e]
e2e_p99 = "2s"
error_rate = "0%"

[[workloads]]
kind = "capacity"
find = "max-concurrency"
slo = ["e2e"]
input_tokens = 512
output_tokens = 128
duration = "6s"                # 4-s steps were coarse on the H100: streams sent 3-6 requests each
max = 256
start = 32                      # fewer steps a launch: the device time is short (auto_tune: ~120 req/s, p99 < 1.2 s)
resolution = "15%"
TOML
}

case "$phase" in
autotune)
  at=$base/at/benchmarks/auto_tune
  mkdir -p "$at"
  [ -f "$repo/.device/auto_tune/auto_tune.sh" ] || { echo "carry .device/auto_tune/auto_tune.sh in this call"; exit 2; }
  [ -f "$base/autotune.pid" ] ||  # never rewrite the script under a running auto_tune (bash reads it as it goes)
  "$py" "$here/_auto_tune_edit.py" "$repo/.device/auto_tune/auto_tune.sh" "$at/auto_tune.sh" \
    MODEL="$models/smollm2" SYSTEM=GPU INPUT_LEN=512 OUTPUT_LEN=128 MAX_MODEL_LEN=2048 MAX_LATENCY_ALLOWED_MS=2000 \
    NUM_SEQS_LIST="64 256" NUM_BATCHED_TOKENS_LIST="2048 8192" || exit 2
  if ! command -v bc >/dev/null; then  # the script does its comparisons in bc; the image may lack it
    mkdir -p "$base/bin"
    printf '%s\n' '#!/usr/bin/env python3' 'import sys' \
      'for e in sys.stdin.read().split(chr(10)):' \
      '    e = e.strip()' \
      '    e and print(int(eval(e)) if any(o in e for o in "<>=") else eval(e))' >"$base/bin/bc"
    chmod +x "$base/bin/bc"; export PATH="$base/bin:$PATH"; echo "bc: a python stand-in (the image has none)"
  fi
  step "vLLM's auto_tune.sh (edited as above)"
  # its whole grid takes ~650 s on an H100: more than a call; 1,500 s bounds it if a boot hangs
  outlive autotune bash -c 'cd "$0" && exec timeout -s TERM 1500 bash ./auto_tune.sh' "$at"
  cp "$base/autotune.out" "$OUT/autotune-run.log"
  [ "$ended" = 1 ] && pkill -if 'vllm serve|vllm::'
  folder=$(ls -d "$base"/auto-benchmark/* 2>/dev/null | tail -1)
  if [ -n "$folder" ]; then
    echo "launches: $(ls "$folder"/vllm_log_* | wc -l) ($(ls "$folder"/vllm_log_* | xargs -n1 basename | tr '\n' ' '))"
    cat "$folder/result.txt"
    cp "$folder/result.txt" "$OUT/auto_tune_result.txt"
    tar -czf "$OUT/autotune.tar.gz" -C "$base" "at" "auto-benchmark"
  fi
  ;;
tune)
  write_config
  # TRIALS and VERIFY (a TOML value: false, or { top = 1, repeats = 2 }) shrink the search to the device time left
  verify=${VERIFY:-"{ top = 1, repeats = 2 }"}
  { campaign_body smol-tune; cat <<TOML

[search]
trials = ${TRIALS:-2}
seed = 0
verify = $verify

[search.space]
"args.max-num-seqs" = [64, 256]
"args.max-num-batched-tokens" = [2048, 8192]
TOML
  } >"$base/smol-tune.toml"
  resume=""  # used only where this call starts it: a tune an earlier call started and lost is resumed
  ls -d "$SERVEDECK_RESULTS"/tunes/smol-tune__* >/dev/null 2>&1 && resume=--resume
  outlive tune "$py" -m servedeck tune "$base/smol-tune.toml" $resume
  cp "$base/tune.out" "$OUT/tune-run.log"
  "$py" -m servedeck tune show | tee "$OUT/tune-show.txt"
  if [ "$ended" = 1 ]; then
    "$py" -m servedeck stop --all >/dev/null 2>&1
    tar -czf "$OUT/tune.tar.gz" -C "$base" results home/launches home/journal.jsonl models.toml smol-tune.toml tune.out 2>/dev/null
  fi
  ;;
grid)
  # auto_tune's four grid points measured by servedeck on the same machine, right after auto_tune: one campaign,
  # a variant a point, the tune's SLO, workload and output check (reference: the starter, 256 / 8192), once each;
  # auto_tune's pick (64 / 8192) right after the starter, so the pair that matters comes first if time runs short
  write_config
  { campaign_body smol-grid 'reference = "starter"'; cat <<TOML

[[variants]]
name = "starter"

[[variants]]
name = "s64-b8192"
args = { max-num-seqs = 64 }
outputs_may_differ = true

[[variants]]
name = "s64-b2048"
args = { max-num-seqs = 64, max-num-batched-tokens = 2048 }
outputs_may_differ = true

[[variants]]
name = "s256-b2048"
args = { max-num-batched-tokens = 2048 }
outputs_may_differ = true
TOML
  } >"$base/smol-grid.toml"
  outlive grid "$py" -m servedeck campaign run "$base/smol-grid.toml"
  cp "$base/grid.out" "$OUT/grid-run.log"
  [ "$ended" = 1 ] && "$py" -m servedeck stop --all >/dev/null 2>&1
  # every call, so what is done comes back even if the device time ends before the campaign does
  tar -czf "$OUT/grid.tar.gz" -C "$base" results/campaigns results/runs smol-grid.toml grid.out 2>/dev/null
  ;;
outputs)
  # t3 of the tune (64 / 8192: auto_tune's best) answered 3 of the 8 greedy prompts otherwise than the starter,
  # which answered them alike at 3 launches: is that the flags, or one launch? The starter and 64 / 8192 twice
  # more each, interleaved, the output check only (no gate, no load).
  write_config
  cat >"$base/smol-outputs.toml" <<TOML
[campaign]
name = "smol-outputs"
model = "smoltune"
cell_timeout = "4m"
gate = false
repeats = ${REPEATS:-2}
reference = "starter"
reference_prompts = 8
reference_tokens = 32

[[variants]]
name = "starter"

[[variants]]
name = "seqs64"
args = { max-num-seqs = 64 }
outputs_may_differ = true

[[workloads]]
kind = "chat"
concurrency = [1]
input_tokens = 64
output_tokens = 16
requests = 4
TOML
  step "servedeck campaign: starter and max-num-seqs=64, ${REPEATS:-2} launch(es) each, the output check"
  timeout -s INT "$(left "${WAIT_S:-560}")" "$py" -m servedeck campaign run "$base/smol-outputs.toml"
  echo "(campaign exit $?)"
  "$py" -m servedeck stop --all >/dev/null 2>&1
  tar -czf "$OUT/outputs.tar.gz" -C "$base" results/campaigns results/runs smol-outputs.toml 2>/dev/null
  ;;
*) echo "unknown phase $phase: autotune | tune | grid | outputs"; exit 2 ;;
esac
echo "done [$(date -u +%FT%TZ)], $(( $(date +%s) - t0 )) s"
