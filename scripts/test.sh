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
# Two pytest-xdist workers by default (tests/workers.py says which tests share one): one process left a core
# idle about half the time, and a fresh clone's suite went from 33:08 of pytest to 21-23 minutes (docs/testing.md).
# SERVEDECK_TEST_WORKERS=0 runs it in one process (a debugger, a test's own timing); -n on the command line wins.
exec .venv/bin/python -m pytest -q -p no:cacheprovider -n "${SERVEDECK_TEST_WORKERS:-2}" "$@"
