"""watchkit (helpers shared with tests/faults) lives beside this file."""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
