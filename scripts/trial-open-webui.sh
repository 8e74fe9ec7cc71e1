#!/usr/bin/env bash
# A chat UI in front of the door, tried for real (issue 49; not in CI: Open WebUI is a large install).
# Installs Open WebUI 0.12.4 in its own venv under the servedeck cache, starts the starter's deck behind
# `servedeck serve` (API key, loopback) in a scratch folder, starts Open WebUI pointed at the door with its
# defaults (native function calling, no max_tokens), and drives headless Chromium to send one message to
# each starter chat model. Screenshots, trial.json (door and engine figures per model), the door's log and
# the engines' timing lines go to docs/door-trial-open-webui/ (or TRIAL_OUT). Everything it starts is
# stopped on exit, the engines too (stopping `serve` leaves them running).
#
#   TRIAL_DIR      scratch folder (default: a new temp folder; kept and named at the end)
#   TRIAL_OUT      where screenshots and figures go (default: docs/door-trial-open-webui)
#   TRIAL_MODELS   default smollm2,gemma        TRIAL_MESSAGE   the one message sent to each
#
# Needs: scripts/setup.sh done (llama-server, the starter's models, Chromium), Python 3.11 or 3.12 (Open
# WebUI 0.12.4 requires >=3.11,<3.13), PyPI reachable for the first install (a 2.9 GB venv, about 5 minutes here). Nothing
# is fetched from the Hugging Face hub: Open WebUI runs with OFFLINE_MODE, and its RAG embeddings (used only
# for files, never for a chat) are pointed at the starter's minilm through the door instead of a
# sentence-transformers download.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
. "$here/_cache.sh"
t0=$SECONDS
OWU_VERSION=0.12.4
owu="$SERVEDECK_CACHE/open-webui-$OWU_VERSION"
out=${TRIAL_OUT:-$repo/docs/door-trial-open-webui}
models=${TRIAL_MODELS:-smollm2,gemma}
sd="$repo/.venv/bin/servedeck"
py="$repo/.venv/bin/python"
say() { printf '\n== %s\n' "$*"; }

# --- Open WebUI, once -----------------------------------------------------------------------------------
if [ ! -f "$owu/installed" ]; then
  say "installing open-webui==$OWU_VERSION in $owu/venv (log: $owu/install.log)"
  base=""
  # 3.11 first: this machine's wheel folder holds torch's CPU build for cp311 (see the pin below)
  for c in python3.11 python3.12; do
    if command -v "$c" >/dev/null && "$c" -c 'import sys, venv, ensurepip
sys.exit(not ((3, 11) <= sys.version_info[:2] < (3, 13)))' 2>/dev/null; then base=$c; break; fi
  done
  if [ -z "$base" ]; then
    echo "Open WebUI $OWU_VERSION requires Python >=3.11,<3.13 with venv; neither python3.11 nor python3.12 is here" >&2
    exit 1
  fi
  mkdir -p "$owu"
  [ -x "$owu/venv/bin/pip" ] || "$base" -m venv "$owu/venv"
  # torch==2.13.0 (sentence-transformers pulls torch in): pip then takes the CPU wheel from the machine's wheel
  # folder (pip.conf find-links) instead of PyPI's CUDA build and its 4 GB of libraries, as setup.sh does for guidellm
  if ! "$owu/venv/bin/pip" install --progress-bar off "open-webui==$OWU_VERSION" torch==2.13.0 >"$owu/install.log" 2>&1; then
    tail -20 "$owu/install.log" >&2
    echo "installing open-webui==$OWU_VERSION failed: $owu/install.log has the whole log" >&2
    exit 1
  fi
  "$owu/venv/bin/pip" freeze >"$owu/installed"
fi
say "open-webui $("$owu/venv/bin/python" -c 'import importlib.metadata as m; print(m.version("open-webui"))') at $owu/venv"

# --- the starter's deck in a scratch folder ---------------------------------------------------------------
trial=${TRIAL_DIR:-$(mktemp -d -t servedeck-owu-trial.XXXXXX)}
mkdir -p "$trial" "$out"
cd "$trial"
export SERVEDECK_HOME="$trial/home" SERVEDECK_RESULTS="$trial/results"
unset SERVEDECK_CONFIG
[ -f models.toml ] || "$sd" init >/dev/null
# Free ports for the door, Open WebUI and each model (other decks and test runs may hold the starter's)
read -r door_port owu_port < <("$py" - <<'PY'
import re
from servedeck.testing.ports import free_port  # below the ephemeral range: that module says why
text = open("models.toml").read()
taken = set()
def port():
    while (p := free_port()) in taken:
        pass
    taken.add(p)
    return p
for name in re.findall(r"^\[models\.([\w-]+)\]$", text, re.M):
    text = re.sub(rf"(\[models\.{re.escape(name)}\]\n[^\[]*?)^port = \d+", rf"\g<1>port = {port()}", text, count=1, flags=re.M | re.S)
open("models.toml", "w").write(text)
print(port(), port())
PY
)
"$py" -c 'import secrets; print(secrets.token_urlsafe(24))' >door.key
chmod 600 door.key
door="http://127.0.0.1:$door_port"
webui="http://127.0.0.1:$owu_port"

door_pid="" owu_pid=""
stop_group() {  # SIGTERM to the whole group, a bounded wait, then SIGKILL (setsid made each a group leader)
  local pid=$1
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM -- "-$pid" 2>/dev/null || true
  for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.5; done
  kill -KILL -- "-$pid" 2>/dev/null || true
}
cleanup() {
  stop_group "$owu_pid"
  stop_group "$door_pid"
  "$sd" stop --all --grace 10 >/dev/null 2>&1 || true  # the door leaves its engines running when it stops
}
trap cleanup EXIT
trap 'exit 130' INT TERM

wait_http() {  # URL PID WHAT SECONDS: until URL answers 200, or PID dies, or time runs out
  local t=0
  until curl -fsS -o /dev/null "$1" 2>/dev/null; do
    kill -0 "$2" 2>/dev/null || { echo "$3 exited before it answered $1" >&2; return 1; }
    [ "$t" -lt "$4" ] || { echo "$3 did not answer $1 within $4 s" >&2; return 1; }
    sleep 1; t=$((t + 1))
  done
}

say "servedeck serve --port $door_port --api-key-file door.key --log-bodies (in $trial)"
setsid "$sd" serve --port "$door_port" --api-key-file door.key --log-bodies >door.log 2>&1 &
door_pid=$!
wait_http "$door/health" "$door_pid" "servedeck serve" 60 || { tail -20 door.log; exit 1; }

say "open-webui serve --port $owu_port (DATA_DIR $trial/open-webui; its log: $trial/open-webui.log)"
key=$(cat door.key)
# Open WebUI's defaults otherwise: native function calling, its built-in tools, no max_tokens, streaming.
# WEBUI_AUTH=False: one user, no sign-in page. OFFLINE_MODE: no hub, no version check.
setsid env DATA_DIR="$trial/open-webui" WEBUI_AUTH=False WEBUI_SECRET_KEY="$key-webui" \
  OPENAI_API_BASE_URL="$door/v1" OPENAI_API_KEY="$key" ENABLE_OLLAMA_API=false \
  OFFLINE_MODE=true HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 ENABLE_VERSION_UPDATE_CHECK=false \
  RAG_EMBEDDING_ENGINE=openai RAG_OPENAI_API_BASE_URL="$door/v1" RAG_OPENAI_API_KEY="$key" RAG_EMBEDDING_MODEL=minilm \
  ANONYMIZED_TELEMETRY=false DO_NOT_TRACK=true SCARF_NO_ANALYTICS=true \
  "$owu/venv/bin/open-webui" serve --host 127.0.0.1 --port "$owu_port" >open-webui.log 2>&1 &
owu_pid=$!
t_owu=$SECONDS
wait_http "$webui/health" "$owu_pid" "open-webui" 600 || { tail -30 open-webui.log; exit 1; }
echo "Open WebUI answered after $((SECONDS - t_owu)) s"

say "headless Chromium: one message to each of $models through Open WebUI"
t_drive=$SECONDS
rc=0
"$py" "$here/_trial_open_webui.py" --webui "$webui" --door "$door" --key-file door.key --door-log door.log --home "$SERVEDECK_HOME" \
  --config models.toml --out "$out" --models "$models" ${TRIAL_MESSAGE:+--message "$TRIAL_MESSAGE"} || rc=$?

# The door's log (request bodies cut at 4 KB by --log-bodies) and each engine's per-task timings
sed "s/$key/<key>/g" door.log >"$out/door.log"
for m in ${models//,/ }; do
  cat "$SERVEDECK_HOME"/launches/"$m"/*/engine.log 2>/dev/null |
    grep -E "print_timing|stop processing|exceeds|error" >"$out/engine-$m.txt" || true
done
{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "servedeck commit: $(git -C "$repo" rev-parse --short HEAD)$(git -C "$repo" diff --quiet HEAD -- src || echo ' (src changed since)')"
  echo "open-webui: $OWU_VERSION; chromium: $(chromium --version 2>/dev/null || chromium-browser --version 2>/dev/null)"
  echo "command: bash scripts/trial-open-webui.sh${TRIAL_MODELS:+ (TRIAL_MODELS=$TRIAL_MODELS)}"
  echo "wall: $((SECONDS - t0)) s (Open WebUI start $((t_drive - t_owu)) s, the browser part $((SECONDS - t_drive)) s)"
  echo "load average at the end: $(cut -d' ' -f1-3 /proc/loadavg) on $(nproc) cores"
} | tee "$out/run.txt"
say "done in $((SECONDS - t0)) s; screenshots and figures in $out; scratch folder kept in $trial"
exit $rc
