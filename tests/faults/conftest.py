"""The fault tests use the watch tests' helpers (tests/watch/watchkit.py) and instrument."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent.parent / "watch"))
