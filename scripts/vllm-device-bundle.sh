#!/usr/bin/env bash
# Step 1 of vLLM on the H200 device (docs/gpu-vllm.md), run HERE, not there: everything the device lacks,
# in parts small enough for one device call each.
#
#   bash scripts/vllm-device-bundle.sh [PART_MIB]      (default 40: a call carries 64 MiB with the checkout,
#                                                       whose tracked files are ~21 MiB by 2026-12-07; 44 was 3 KB over)
#
# Downloads the wheels pinned in scripts/device/vllm-0.26-cu130.txt (cp312 manylinux x86_64; pip checks each
# against its sha256) into $SERVEDECK_CACHE/device-wheels, adds SmolLM2-135M-Instruct's GGUF and tokenizer
# files (real weights, so a gate can pass on the GPU; scripts/setup.sh prepared them), packs it all into one
# tar, and splits that into .device/vllm/part-NN of PART_MIB each, with .device/vllm/MANIFEST (the sha256 of
# every part and of the whole). .device/ is ignored by git. Then prints the device calls that move the parts.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
. "$here/_cache.sh"
part_mib=${1:-40}
lock=$here/device/vllm-0.26-cu130.txt
wheels=$SERVEDECK_CACHE/device-wheels
out=$repo/.device/vllm
mkdir -p "$wheels"

# The platform tags pip matches exactly (manylinux_2_N for each N a wheel here uses); pure wheels match any.
plats=()
for p in manylinux_2_5 manylinux1 manylinux_2_17 manylinux2014 manylinux_2_24 manylinux_2_26 manylinux_2_27 \
         manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux_2_35; do plats+=(--platform "${p}_x86_64"); done
echo "== wheels (pinned, hashed) -> $wheels"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plats[@]}" \
  --require-hashes -r "$lock" -d "$wheels" 2> >(grep -v "^WARNING: Location" >&2)
n=$(grep -c -- '--hash=' "$lock")
have=$(ls "$wheels"/*.whl | wc -l)
[ "$have" -ge "$n" ] || { echo "only $have of $n wheels in $wheels" >&2; exit 1; }

echo "== models: SmolLM2-135M-Instruct (GGUF + tokenizer files from the HF conversion)"
eval "$("$here/prepare-models.sh" | grep -E '^(smollm2_gguf|smollm2_hf)=')"
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bundle/wheels" "$stage/bundle/smollm2-tokenizer"
# only the lock's files (the cache may hold other versions from earlier locks)
while read -r req _; do
  name=${req%%==*}; ver=${req#*==}
  f=$(ls "$wheels" | grep -i -E "^${name//-/[-_]}-${ver}-" | head -1)
  [ -n "$f" ] || { echo "no wheel for $req in $wheels" >&2; exit 1; }
  ln -s "$wheels/$f" "$stage/bundle/wheels/$f"
done < <(grep -v '^#' "$lock" | grep -- '--hash=')
cp "$lock" "$stage/bundle/lock.txt"
ln -s "$smollm2_gguf" "$stage/bundle/smollm2-135m-instruct-q4_1.gguf"
for f in tokenizer.json tokenizer_config.json chat_template.jinja special_tokens_map.json generation_config.json; do
  [ -f "$smollm2_hf/$f" ] && cp "$smollm2_hf/$f" "$stage/bundle/smollm2-tokenizer/"
done

echo "== parts of $part_mib MiB -> $out"
rm -rf "$out"
mkdir -p "$out"
tar -C "$stage" -chf "$stage/bundle.tar" bundle
split -b "${part_mib}M" -d -a 2 "$stage/bundle.tar" "$out/part-"
{
  echo "# sha256  file  (the whole tar last)"
  (cd "$out" && sha256sum part-*)
  echo "$(sha256sum "$stage/bundle.tar" | cut -d' ' -f1)  bundle.tar"
} >"$out/MANIFEST"
parts=$(ls "$out"/part-* | wc -l)
echo "$parts parts, $(du -sh "$stage/bundle.tar" | cut -f1) in all"
echo
echo "Move them with one device call per part, back to back (the machine keeps /tmp while warm, 30 s):"
for p in "$out"/part-*; do
  echo "  run(carry=[\".device/vllm/$(basename "$p")\", \".device/vllm/MANIFEST\"], command=\"bash scripts/vllm-device-receive.sh\")"
done
echo "then: run(command=\"OUT=\$OUT bash scripts/gpu-vllm.sh PHASE\") (docs/gpu-vllm.md)"
