#!/usr/bin/env bash
# The README's test command: set everything up (cached after the first run), then run the whole suite.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(dirname "$here")
"$here/setup.sh"
cd "$repo"
# Unbuffered: pytest's summary reaches the log as it is written, even if something kills pytest after
# it (a run once ended at "short test summary info" with the count line lost in stdout's buffer).
# tests/conftest.py bounds the interpreter's exit after the summary; the exit code is pytest's own.
export PYTHONUNBUFFERED=1
# One process by default. SERVEDECK_TEST_WORKERS=2 runs two pytest-xdist workers (tests/workers.py says which
# tests share one): a fresh clone's suite went from 33:08 to 22:38 and 21:19, but the second of those runs
# failed the llama.cpp page's campaign verdict (p1 must lose to base; under the other worker's load it won),
# so two workers wait until that verdict holds under load (docs/testing.md).
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${SERVEDECK_TEST_WORKERS:-0}" "$@"
