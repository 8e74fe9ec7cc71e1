#!/usr/bin/env bash
# Issue 14 on a host with cores to spare (the device tool's H200 machine: 16 cores): how accurate the
# load generator is at 64 and 256 streams when the instrument has cores of its own and the client runs
# in 1, 2 or 4 processes (--client-procs), against both instrument modes (cheap and realistic), with
# the aiohttp client beside it for comparison. Medians of 3 interleaved runs.
#
# Run in the repo root:   OUT=/some/dir bash scripts/gpu-loadgen.sh
# Writes $OUT/loadgen_accuracy_gpu.json (rewritten after each repetition) and $OUT/loadgen.log.
# Offline hosts: the Python packages come from the host's python3 (the device image has numpy, rich,
# aiohttp and uvloop); anything missing can travel as wheels in .whl/ (installed into the venv).
#   PYTHON=python3          the interpreter to build the venv from
#   CLIENT_CPUS=0-3         where the client (and its processes) run
#   INSTRUMENT_CPUS=8-9     where the two instruments run (one each, by the OS)
#   REPS=3  PROCS="1 2 4"   CONCURRENCY="64 256"
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
OUT=${OUT:-$repo/gpu-loadgen-out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/loadgen.log") 2>&1
export PYTHONUNBUFFERED=1
py=${PYTHON:-python3}
venv=${VENV:-/tmp/servedeck-loadgen-venv}

echo "=== host [$(date -u +%FT%TZ)]"
uname -a; nproc; cat /proc/loadavg 2>/dev/null || true
ncpu=$(nproc)
if [ "$ncpu" -lt "${MIN_CPUS:-12}" ]; then
  echo "only $ncpu CPUs: this script wants 12 or more (client and instrument on cores of their own)"; exit 2
fi

. "$here/_device_venv.sh"
"$venv/bin/python" - <<'EOF' || { echo "missing Python packages: carry their wheels in .whl/"; exit 2; }
import aiohttp, numpy, rich, servedeck.loadgen.procs, servedeck.testing.instrument
from servedeck.loadgen.loop import preferred
print("servedeck from", servedeck.loadgen.procs.__file__, "| event loop:", preferred())
EOF

echo "=== accuracy: 64/256 streams, client procs ${PROCS:-1 2 4}, both instrument modes [$(date -u +%FT%TZ)]"
# shellcheck disable=SC2086  # the lists are meant to split
timeout "${BENCH_TIMEOUT_S:-540}" "$venv/bin/python" "$repo/bench/loadgen_accuracy.py" \
  --modes cheap realistic --clients servedeck aiohttp --client-procs ${PROCS:-1 2 4} \
  --concurrency ${CONCURRENCY:-64 256} --reps "${REPS:-3}" \
  --client-cpus "${CLIENT_CPUS:-0-3}" --instrument-cpus "${INSTRUMENT_CPUS:-8-9}" \
  --out "$OUT/loadgen_accuracy_gpu.json"
rc=$?
echo "=== done (exit $rc) [$(date -u +%FT%TZ)]"
cat /proc/loadavg 2>/dev/null || true
exit $rc
