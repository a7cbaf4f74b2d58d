"""Bounds on the HTTP connections of the OpenAI endpoint, so that no client can exhaust this
process's file descriptors (which the supervisor in the same process needs to read /proc).

uvicorn closes an idle keep-alive connection only after a response; a connection that never
sends a request stays open for good, so a flood of idle connections used to reach the descriptor
limit (``OSError: [Errno 24] Too many open files``) and take supervision down with it. Here:

- :func:`raise_open_files_limit` lifts the soft descriptor limit to the hard one;
- :func:`guarded_protocol` is uvicorn's HTTP protocol with two more rules: a new connection must
  start a request within the keep-alive timeout (the timer uvicorn arms after each response is
  armed at connect too), and past ``max_connections`` a new connection closes the longest-idle
  one (no request in progress), or itself when every other one is busy. Requests in progress
  are never cut.
"""

from __future__ import annotations

import resource
import time
from typing import Any

# Descriptors kept for everything else of the process (gRPC channels to Triton, /proc reads, logs).
RESERVED_DESCRIPTORS = 256


def raise_open_files_limit() -> int:
    """Set the soft RLIMIT_NOFILE to the hard one (what this process may have); returns the soft limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass  # a container may forbid it; the connection cap below follows the soft limit
    return soft


def connection_cap(open_files_limit: int) -> int:
    """The most HTTP connections the endpoint keeps under ``open_files_limit`` descriptors."""
    return max(16, open_files_limit - RESERVED_DESCRIPTORS)


def _busy(protocol: Any) -> bool:
    cycle = getattr(protocol, "cycle", None)
    return cycle is not None and not cycle.response_complete


def guarded_protocol(base: type, max_connections: int) -> type:
    """``base`` (uvicorn's httptools or h11 protocol class) with the rules of this module."""

    class GuardedProtocol(base):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.idle_since = time.monotonic()
            # The keep-alive timer uvicorn arms after a response, armed for the first request too;
            # data_received cancels it as for any keep-alive connection.
            self.timeout_keep_alive_task = self.loop.call_later(
                self.timeout_keep_alive, self.timeout_keep_alive_handler
            )
            if len(self.connections) > max_connections:
                idle = [other for other in self.connections if other is not self and not _busy(other)]
                victim = min(idle, key=lambda other: getattr(other, "idle_since", 0.0)) if idle else self
                victim.transport.close()

        def on_response_complete(self) -> None:
            self.idle_since = time.monotonic()
            super().on_response_complete()

    GuardedProtocol.__name__ = f"Guarded{base.__name__}"
    return GuardedProtocol


def uvicorn_protocol(max_connections: int) -> type:
    """The guarded protocol over the HTTP implementation uvicorn would pick ("auto": httptools when
    installed, else h11)."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base: type = HttpToolsProtocol
    except ImportError:
        from uvicorn.protocols.http.h11_impl import H11Protocol

        base = H11Protocol
    return guarded_protocol(base, max_connections)
