"""A free TCP port on 127.0.0.1, for the servers and process groups tests start."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port no socket holds now (the OS picks it; a later bind can still race another process)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]
