"""Free loopback ports for tests that start servers: `servedeck.testing.ports` (below the kernel's ephemeral
range, never by binding port 0, each xdist worker in its own share; that module says why), which the bench
scripts and the demo use too, and the starter models.toml with its ports moved to free ones."""

from __future__ import annotations

from servedeck.testing.ports import free_port, free_port_pair  # noqa: F401  (tests import them from here)


def starter_toml() -> str:
    """`servedeck init`'s starter models.toml with each model's port moved to a free one."""
    from servedeck.init import render_starter

    text = render_starter()
    for old in ("8081", "8091", "8082", "8092"):
        text = text.replace(f"port = {old}", f"port = {free_port()}")
    return text
