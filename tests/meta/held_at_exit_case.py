"""Run only as its own pytest session by test_session_end.py: a passing test that leaves a non-daemon
thread blocked, which holds the interpreter after pytest's summary."""

import threading

never = threading.Event()


def blocked_forever():
    never.wait()


def test_leaves_a_blocked_thread_behind():
    threading.Thread(target=blocked_forever).start()
    assert True
