"""A request due at a time is sent at that time or after, never before: every wait toward a clock time goes
through `servedeck.loadgen.schedule.sleep_until`.

uvloop counts a delay in whole milliseconds from a cached clock, and its timer fired up to 0.42 ms early here
(f647f80 fixed the schedule). The trace replay kept its own `asyncio.sleep(due - perf_counter())`, and CI at
stop 44 failed on it: a trace request went out 93 µs before its time (t_send 5.090907 < t_target 5.091).
This rule refuses a sleep whose delay is computed from the clock anywhere but in `sleep_until` itself.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "servedeck"
CLOCKS = {"perf_counter", "monotonic", "time"}


def _reads_clock(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else None
            if name in CLOCKS:
                return True
    return False


def _is_sleep(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "sleep"
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "asyncio")


def clock_sleeps(source: str) -> list[int]:
    """Lines of `asyncio.sleep` whose delay reads a clock, or whose computed delay sits in a loop whose test reads
    one, outside a function named sleep_until. A constant poll in a deadline loop is not a wait toward a time."""
    found: list[int] = []

    def visit(node: ast.AST, in_until: bool, clock_loop: bool) -> None:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            in_until = node.name == "sleep_until"
        if isinstance(node, ast.While) and _reads_clock(node.test):
            for child in node.body:
                visit(child, in_until, True)
            return
        computed = any(not isinstance(a, ast.Constant) for a in node.args) if _is_sleep(node) else False
        if _is_sleep(node) and not in_until and (clock_loop and computed or any(_reads_clock(a) for a in node.args)):
            found.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, in_until, clock_loop)

    visit(ast.parse(source), False, False)
    return found


def test_every_wait_toward_a_time_goes_through_sleep_until():
    found = [f"{f.relative_to(SRC)}:{n}" for f in sorted(SRC.rglob("*.py")) for n in clock_sleeps(f.read_text())]
    assert not found, "await servedeck.loadgen.schedule.sleep_until(due) instead:\n" + "\n".join(found)


def test_the_rule_sees_the_sleeps_it_is_for():
    assert clock_sleeps("async def f():\n    await asyncio.sleep(max(0.0, due - time.perf_counter()))\n") == [2]
    assert clock_sleeps("async def f():\n    while (w := due - perf_counter()) > 0:\n"
                        "        await asyncio.sleep(w)\n") == [3]
    assert clock_sleeps("async def sleep_until(t):\n    while (d := t - perf_counter()) > 0:\n"
                        "        await asyncio.sleep(d)\n") == []
    assert clock_sleeps("async def f():\n    await asyncio.sleep(every_s)\n") == []  # a period, not a due time
    assert clock_sleeps("async def f():\n    while loop.time() < end:\n"
                        "        await asyncio.sleep(0.02)\n") == []  # a poll until a deadline, not a due time
