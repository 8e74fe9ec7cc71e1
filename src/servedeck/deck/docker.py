"""Docker clean-up for a launch run in a container (a build with `image`)."""

from __future__ import annotations

import subprocess

from servedeck.deck.records import LiveRecord


def remove_container(rec: LiveRecord) -> None:
    """Killing `docker run` does not always remove its container: make sure it is gone."""
    if rec.image:
        subprocess.run([rec.docker or "docker", "rm", "-f", f"servedeck-{rec.model}"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
