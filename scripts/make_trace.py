"""Write a small synthetic trace in Mooncake's JSONL format (timestamp ms, input_length, output_length,
hash_ids) for servedeck's trace workload: `conversations` chains of blocks that grow turn by turn (each
turn's hash_ids extend the last's), mixed with requests of blocks of their own. Made here from a seed,
copied from nowhere.

    .venv/bin/python scripts/make_trace.py OUT.jsonl [--chains 2] [--turns 3] [--block-tokens 512] [--gap-ms 2000]
"""

from __future__ import annotations

import argparse
import json
import random


def make(chains: int, turns: int, block_tokens: int, gap_ms: int, output: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows, next_id, t = [], 0, 0
    chain_ids: list[list[int]] = [[] for _ in range(chains)]
    for _ in range(turns):
        for c in range(chains):
            chain_ids[c] = chain_ids[c] + [next_id]
            next_id += 1
            rows.append({"timestamp": t, "input_length": len(chain_ids[c]) * block_tokens, "output_length": output,
                         "hash_ids": list(chain_ids[c])})
            t += gap_ms + rng.randrange(gap_ms // 4 + 1)
        rows.append({"timestamp": t, "input_length": block_tokens, "output_length": output, "hash_ids": [next_id]})
        next_id += 1
        t += gap_ms
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--chains", type=int, default=2)
    ap.add_argument("--turns", type=int, default=3)
    ap.add_argument("--block-tokens", type=int, default=512)
    ap.add_argument("--gap-ms", type=int, default=2000)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rows = make(a.chains, a.turns, a.block_tokens, a.gap_ms, a.output_tokens, a.seed)
    with open(a.out, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    print(f"{a.out}: {len(rows)} requests over {rows[-1]['timestamp'] / 1000:.1f} s")


if __name__ == "__main__":
    main()
