"""No package attribute hides one of its modules (issue 21, item 4). A re-export such as
`from servedeck.campaign.session import bench` in campaign/__init__.py made `servedeck.campaign.bench`
the function, so `import servedeck.campaign.bench as m` gave the function, not the module bench.py."""

from __future__ import annotations

import importlib
import pkgutil
import sys
from pathlib import Path

import servedeck


def test_every_module_is_its_packages_attribute_of_that_name():
    names = [m.name for m in pkgutil.walk_packages(servedeck.__path__, "servedeck.")
             if not m.name.endswith(".__main__")]  # __main__ runs the CLI when imported
    for name in names:
        importlib.import_module(name)
    hidden = {}
    for name in names:
        parent, _, leaf = name.rpartition(".")
        found = getattr(sys.modules[parent], leaf, None)
        if found is not sys.modules[name]:
            hidden[name] = type(found).__name__
    assert hidden == {}


def test_every_module_file_is_in_a_package_the_walk_finds():
    # A folder without __init__.py is a namespace package that pkgutil.walk_packages skips, with all its
    # modules: servedeck/workloads had none, and its 21 modules went unchecked above (issue 50, item 4).
    src = Path(servedeck.__file__).parent
    files = {".".join(("servedeck", *p.relative_to(src).with_suffix("").parts)).removesuffix(".__init__")
             for p in src.rglob("*.py")}
    walked = {m.name for m in pkgutil.walk_packages(servedeck.__path__, "servedeck.")} | {"servedeck"}
    assert sorted(files - walked) == []
