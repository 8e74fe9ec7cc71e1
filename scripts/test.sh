#!/usr/bin/env bash
# The README's test command: set everything up (cached after the first run), then run the whole suite.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
"$here/setup.sh"
cd "$repo"
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
