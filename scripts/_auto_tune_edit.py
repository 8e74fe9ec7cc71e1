"""Issue 51's device side by side: vLLM's benchmarks/auto_tune/auto_tune.sh, edited for the run, each edit named.

    python3 scripts/_auto_tune_edit.py ORIGINAL EDITED KEY=VALUE...   (the settings at its top: MODEL, INPUT_LEN, ...)

The original is vllm-project/vllm's benchmarks/auto_tune/auto_tune.sh at commit 01277f9 (sha256 below), carried
to the device in .device/auto_tune/ (ignored by git: it is vLLM's file, not ours). auto_tune is used by editing
the settings at its top; the other edits are what a run on vLLM 0.26 with no network needs, each checked to
apply exactly once so a different version of the script is refused rather than half edited."""
from __future__ import annotations

import hashlib
import re
import sys

SHA256 = "9ea9183bfdf33bfdf43740b8e66588d07a9662969dd2974df388ebfd5d22c89a"

EDITS = [
    # (why, old, new)
    ("no network on the device: pip would retry for minutes (the random dataset needs no `datasets`)",
     "pip install -q datasets\n", ""),
    ("vLLM 0.26 no longer has --disable-log-requests (request logging is off unless --enable-log-requests): "
     "as shipped, every `vllm serve` of the script exits on an unrecognized argument",
     '        "--disable-log-requests"\n', ""),
    ("`pkill -if vllm` matches any command line holding 'vllm' (the device's harness, this run's wrapper): "
     "narrowed to the servers it starts and their engine cores",
     "pkill -if vllm", "pkill -if 'vllm serve|vllm::'"),
]
# the last step re-launches the winner under the torch profiler: a trace, not part of the search
PROFILE = re.compile(r'\nif \(\( \$\(echo "\$best_throughput > 0" \| bc -l\) \)\); then\n.*?\nfi\n', re.S)


def main(argv: list[str]) -> int:
    src, dst, *settings = argv
    text = open(src).read()
    got = hashlib.sha256(text.encode()).hexdigest()
    if got != SHA256:
        print(f"{src}: sha256 {got}, expected {SHA256} (auto_tune.sh at vllm 01277f9)", file=sys.stderr)
        return 2
    for why, old, new in EDITS:
        n = text.count(old)
        if n < 1 or (old != "pkill -if vllm" and n != 1):
            print(f"edit not applicable ({n} matches): {why}", file=sys.stderr)
            return 2
        text = text.replace(old, new)
        print(f"edit: {why}")
    text, n = PROFILE.subn("\n", text)
    if n != 1:
        print(f"the final profiling run's block matched {n} times", file=sys.stderr)
        return 2
    print("edit: the final profiling run of the winner removed (a torch trace, not part of the search)")
    for kv in settings:
        key, value = kv.split("=", 1)
        line = re.compile(rf"^{re.escape(key)}=.*$", re.M)
        if len(line.findall(text)) != 1:
            print(f"setting {key}: not exactly one line in the script", file=sys.stderr)
            return 2
        text = line.sub(f'{key}="{value}"', text)
        print(f"setting: {key}={value}")
    open(dst, "w").write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
