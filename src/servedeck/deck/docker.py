"""Docker clean-up for a launch run in a container (a build with `image`)."""

from __future__ import annotations

import subprocess

from servedeck.deck.records import LiveRecord
from servedeck.engines.base import container_name


def container_of(rec: LiveRecord) -> str:
    """The container name the launch was given: read from its own argv (`--name X`), so a launch rendered
    by another servedeck version is still found; else the name this version gives the model."""
    argv = list((rec.spec or {}).get("argv") or [])
    if "--name" in argv[:-1]:
        return argv[argv.index("--name") + 1]
    return container_name(rec.model)


def remove_container(rec: LiveRecord) -> None:
    """Killing `docker run` does not always remove its container: make sure it is gone."""
    if rec.image:
        subprocess.run([rec.docker or "docker", "rm", "-f", container_of(rec)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
