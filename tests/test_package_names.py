"""No package attribute hides one of its modules (issue 21, item 4). A re-export such as
`from servedeck.campaign.session import bench` in campaign/__init__.py made `servedeck.campaign.bench`
the function, so `import servedeck.campaign.bench as m` gave the function, not the module bench.py."""

from __future__ import annotations

import importlib
import pkgutil
import sys

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
