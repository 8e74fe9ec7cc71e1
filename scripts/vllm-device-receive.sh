#!/usr/bin/env bash
# Step 2 of vLLM on the H200 device (docs/gpu-vllm.md), run THERE, once per call that carries a part made by
# scripts/vllm-device-bundle.sh: checks the parts this call brought against .device/vllm/MANIFEST and keeps
# them in /tmp/vllm-parts, which outlives the call while the machine stays warm. Says which parts are still to
# come; once all are there, scripts/_device_vllm.sh (sourced by gpu-vllm.sh) assembles and installs them.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
src=$repo/.device/vllm
keep=/tmp/vllm-parts
mkdir -p "$keep"
[ -f "$src/MANIFEST" ] || { echo "no .device/vllm/MANIFEST in this call: carry it with each part"; exit 2; }
cp "$src/MANIFEST" "$keep/MANIFEST"
for p in "$src"/part-*; do
  [ -f "$p" ] || continue
  want=$(grep " $(basename "$p")\$" "$src/MANIFEST" | cut -d' ' -f1)
  got=$(sha256sum "$p" | cut -d' ' -f1)
  if [ "$want" != "$got" ]; then echo "$(basename "$p"): sha256 $got, MANIFEST says $want"; exit 2; fi
  cp "$p" "$keep/" && echo "$(basename "$p") kept ($(du -h "$p" | cut -f1))"
done
missing=$(grep -o 'part-[0-9]*$' "$keep/MANIFEST" | while read -r f; do [ -f "$keep/$f" ] || echo "$f"; done | tr '\n' ' ')
echo "still to come: ${missing:-none}"
