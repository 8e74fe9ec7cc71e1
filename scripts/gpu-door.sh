#!/usr/bin/env bash
# Issue 12 on a host with cores to spare (the device tool's H200 machine: 16 cores): what the front
# door adds in front of the timing instrument at 1, 64 and 256 streams, with client, door and
# instrument each held to CPUs of their own, and the same run unpinned (64 and 256 streams) beside it. No engine and no
# GPU work: the door's own cost, without three Python processes fighting over two cores.
#
# Run in the repo root:   OUT=/some/dir bash scripts/gpu-door.sh
# Writes $OUT/door_latency_pinned.json, $OUT/door_latency_unpinned.json and $OUT/door.log.
# Offline hosts: packages come from the host's python3; missing ones (pydantic, platformdirs on the
# device image) travel as wheels in .whl/ (scripts/_device_venv.sh installs them).
#   PYTHON=python3   REPS=2   ROUNDS=3   CONCURRENCY="1 64 256"
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-$repo/gpu-door-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/door.log") 2>&1
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
venv=${VENV:-/tmp/servedeck-door-venv}

echo "=== host [$(date -u +%FT%TZ)]"
uname -a; nproc; cat /proc/loadavg 2>/dev/null || true
if [ "$(nproc)" -lt 8 ]; then echo "only $(nproc) CPUs: this script wants 8 or more"; exit 2; fi
. "$here/_device_venv.sh"
"$venv/bin/python" -c 'import aiohttp, pydantic, servedeck.door, servedeck.testing.instrument; from servedeck.loadgen.loop import preferred; print("event loop:", preferred())' \
  || { echo "missing Python packages: carry their wheels in .whl/"; exit 2; }

# shellcheck disable=SC2086  # the lists are meant to split
for how in pinned unpinned; do
  pins=()
  conc=${CONCURRENCY:-1 64 256}
  if [ "$how" = pinned ]; then pins=(--pin client=0-1 door=4-5 instrument=8-9); else conc=${UNPINNED_CONCURRENCY:-64 256}; fi
  echo "=== door vs direct, $how [$(date -u +%FT%TZ)]"
  timeout "${BENCH_TIMEOUT_S:-260}" "$venv/bin/python" "$repo/bench/door_latency.py" --targets instrument \
    --concurrency $conc --reps "${REPS:-2}" --rounds "${ROUNDS:-3}" "${pins[@]}" \
    --out "$OUT/door_latency_$how.json"
  echo "=== $how: exit $?"
done
cat /proc/loadavg 2>/dev/null || true
