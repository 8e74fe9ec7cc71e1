"""How `start --foreground` turns the engine's end into its own exit code (what systemd's Restart= reads)."""

from servedeck.deck.foreground import exit_code


def test_exit_codes():
    assert exit_code({"returncode": 0, "signal": None}) == 0
    assert exit_code({"returncode": 3, "signal": None}) == 3
    assert exit_code({"returncode": None, "signal": "SIGKILL"}) == 137
    assert exit_code({"returncode": None, "signal": "SIGSEGV"}) == 139
    assert exit_code(None) == 1  # no exit record (the shim itself was killed): a failure all the same
