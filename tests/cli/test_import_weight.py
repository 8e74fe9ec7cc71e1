"""`servedeck --help` imports the whole command tree (typer registers each command at import), and every other
command line imports everything its own command module imports (tests/cli/test_lazy_commands.py), so what a
module imports at its top is paid far from where it is used. scipy.stats (~0.4 s) and matplotlib (~0.3 s) are imported where an interval is
computed or a figure drawn (report/stats.py, report/accuracy.py, report/sections.py); this keeps them
there. Measured 2026-12-04 on this 2-core box: `servedeck --help` took 1.6 s with them at the top and
0.6 s without (`/usr/bin/time -f %e .venv/bin/servedeck --help`, three runs each)."""

from __future__ import annotations

import json
import subprocess
import sys

# numpy (~0.1 s), jinja2, rich.markdown (with markdown-it) and prometheus-client's parser likewise: they
# are imported where a percentile is computed, a page rendered, markdown drawn or /metrics parsed.
HEAVY = ("scipy", "matplotlib", "numpy", "jinja2", "rich.markdown", "prometheus_client")


def test_the_command_tree_imports_none_of_the_heavy_libraries():
    code = ("import json, sys; from servedeck.cli import root_app; "
            f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == [], ("imported at the top of a module the CLI loads; import it where it is "
                                        "used (see this test's docstring): " + r.stdout)


def test_a_report_still_draws_its_figures_with_them():
    """The lazy import is not a lost one: a figure imports matplotlib when it is drawn, a percentile numpy."""
    code = ("import sys; from servedeck.report.stats import spread; s = spread([1.0, 2.0, 3.0]); "
            "assert s.low is not None and 'scipy' in sys.modules; "
            "from servedeck.report import plots; assert 'matplotlib' in sys.modules; "
            "from servedeck.loadgen.stats import dist; assert dist([1.0, 2.0, 3.0])['p50'] == 2.0; "
            "from servedeck.engines.metrics import parse_prometheus; "
            "assert parse_prometheus('a_total 2\\n') == {'a_total': 2.0}; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
