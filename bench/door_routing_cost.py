"""What the door's replica routing policies cost per request, CPU time in `pick` alone.

16 conversations of 8 turns behind one shared system prompt (4,000 characters; each user turn and
answer 800 random letters), sent turn by turn to 2 replicas as the manager does (the chosen
replica's outstanding and sent counted up; one request finished before the next is sent). Each
policy picks for the same 128 requests; `prefix` then holds up to 64 recent requests per replica,
each up to its prefix_chars (16,384). Median of --reps of the per-request mean. Prints a table and
writes JSON.

    .venv/bin/python bench/door_routing_cost.py [--reps 5] [--out bench/results/door_routing_cost.json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import time
from pathlib import Path

from servedeck.door.policy import POLICIES, Ask, Replica, replica_policy


def requests(seed: int = 1, users: int = 16, turns: int = 8) -> list[Ask]:
    rnd = random.Random(seed)
    letters = string.ascii_letters + " "
    system = {"role": "system", "content": "".join(rnd.choices(letters, k=4000))}
    convs: list[list[dict]] = [[] for _ in range(users)]
    out = []
    for _ in range(turns):
        for u in range(users):
            convs[u].append({"role": "user", "content": "".join(rnd.choices(letters, k=800))})
            doc = {"model": "m", "messages": [system, *convs[u]]}
            out.append(Ask(b"/v1/chat/completions", [(b"x-session-id", str(u).encode())], json.dumps(doc).encode(),
                           doc))
            convs[u].append({"role": "assistant", "content": "".join(rnd.choices(letters, k=800))})
    return out


def mean_pick_us(name: str, asks: list[Ask]) -> float:
    policy, replicas = replica_policy(name), [Replica("http://r1"), Replica("http://r2")]
    spent = 0
    for ask in asks:
        t = time.process_time_ns()
        r = policy.pick(ask, replicas)
        spent += time.process_time_ns() - t
        r.sent += 1
    return spent / len(asks) / 1000


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path("bench/results/door_routing_cost.json"))
    a = ap.parse_args()
    asks = requests()
    rows = {name: statistics.median(mean_pick_us(name, asks) for _ in range(a.reps)) for name in POLICIES}
    print(f"{'policy':<20} {'pick, µs per request':>22}")
    for name, us in rows.items():
        print(f"{name:<20} {us:>22.1f}")
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"requests": len(asks), "reps": a.reps, "pick_us": rows,
                                 "when": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}, indent=1) + "\n")


if __name__ == "__main__":
    main()
