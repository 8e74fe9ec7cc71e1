# Sourced by the setup scripts: one cache outside the repo, keyed by version, so a second run is fast.
SERVEDECK_CACHE="${SERVEDECK_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servedeck}"
export SERVEDECK_CACHE
mkdir -p "$SERVEDECK_CACHE"
