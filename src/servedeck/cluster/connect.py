"""`--ray ADDRESS`: connect this process to a Ray cluster for the length of a command.

    auto      the cluster already running on this machine (`ray start --head` here, or a node of it)
    local     start a one-machine cluster for this command and stop it afterwards (its own, even when
              RAY_ADDRESS names a cluster or one was started here with `ray start`)
    ADDRESS   host:port of a cluster's head (GCS), or ray://host:10001 through Ray Client

SERVEDECK_RAY_ADDRESS gives the address when the option is left out.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator, Optional

from servedeck.cluster import require_ray
from servedeck.errors import ServedeckError

ENV = "SERVEDECK_RAY_ADDRESS"


def address_from(option: Optional[str]) -> Optional[str]:
    return option or os.environ.get(ENV) or None


@contextlib.contextmanager
def connected(address: str) -> Iterator[None]:
    ray = require_ray()
    if ray.is_initialized():  # a caller (a test, a notebook) connected already: use that
        yield
        return
    kw = dict(logging_level=logging.WARNING, log_to_driver=False, namespace="servedeck")
    try:
        if address == "local":
            # "local", not None: None joins the cluster in RAY_ADDRESS or the last `ray start` here
            ray.init(address="local", include_dashboard=False, **kw)
        else:
            ray.init(address=address, **kw)
    except (ConnectionError, ValueError, RuntimeError) as e:
        what = "no Ray cluster is running on this machine" if address == "auto" else f"cannot reach Ray at {address}"
        raise ServedeckError(f"--ray {address}: {what} ({str(e).splitlines()[0][:200]})",
                             hint="start one with `ray start --head` (and `ray start --address HEAD:6379` on each "
                                  "node), give its address, or use --ray local") from None
    try:
        yield
    finally:
        ray.shutdown()
