# What scripts/demo.sh prints, sourced by it (and by tests/cli/test_demo_ending.py, which runs the closing line).

# A step's heading; bold only on a terminal: piped into a log (`| tee demo.log`), escape codes would be
# written into the file.
say() {
  local bold="" plain=""
  if [ -t 1 ]; then bold=$'\033[1m' plain=$'\033[0m'; fi
  printf '\n%s== %s%s (%ss)\n' "$bold" "$1" "$plain" "$((SECONDS - ${t0:-0}))"
}

# Where a user goes on from: `servedeck` lives in the repo's venv (not on PATH), and the demo's state and
# results are under its scratch folder, which only these variables point servedeck at.
#   next_steps REPO DEMO_FOLDER
next_steps() {
  local repo=$1 demo=$2
  cat <<LINES

servedeck is $repo/.venv/bin/servedeck (not on your PATH); to put it there in this shell:
  source $repo/.venv/bin/activate
What the demo did, from its records (the launch, why, memory, what was measured):
  SERVEDECK_HOME=$demo/home SERVEDECK_RESULTS=$demo/results $repo/.venv/bin/servedeck --config $demo/models.toml page smollm2
LINES
}
