"""While ``trt-spec serve`` drains, the engine models we write refuse requests that are not the loop's.

A drain (SIGTERM) unloads the clients' entry points, but the engine models must stay: the loop's
requests in flight still call them. A client calling ``tensorrt_llm`` or ``tensorrt_llm_draft``
directly would be admitted too, so ``serve`` gives Triton's environment (which every python-backend
stub inherits) two variables:

- :data:`DRAIN_FILE_ENV`: a file that exists once the drain has begun (``serve`` creates it before
  it unloads the entry points);
- :data:`LOOP_TOKEN_ENV`: a random token of this server. The loop model sends it with each engine
  call as the request parameter :data:`LOOP_CALL_PARAMETER` (python backend BLS
  ``InferenceRequest(..., parameters=...)``), so a client cannot pass for the loop.

An engine model checks the file once per ``execute`` (one ``stat``) and reads a request's parameters
only while it exists. Served by anything but ``serve`` (neither variable set), nothing is refused
and the loop sends no parameter. Standard library only: loaded inside Triton's python-backend stub.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping

DRAIN_FILE_ENV = "TRT_SPEC_DRAIN_FILE"
LOOP_TOKEN_ENV = "TRT_SPEC_LOOP_TOKEN"
LOOP_CALL_PARAMETER = "trt_spec_loop"


def loop_call_parameters(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The parameters the loop model's engine calls carry: this server's token, or none."""
    token = environ.get(LOOP_TOKEN_ENV)
    return {LOOP_CALL_PARAMETER: token} if token else {}


class DrainGate:
    """An engine model's side: whether the server drains, and whether a request is the loop's."""

    def __init__(self, model: str, environ: Mapping[str, str] = os.environ):
        self.model = model
        self.drain_file = environ.get(DRAIN_FILE_ENV) or None
        self.token = environ.get(LOOP_TOKEN_ENV) or None

    def draining(self) -> bool:
        """Whether the drain has begun (checked once per ``execute``)."""
        return self.drain_file is not None and os.path.exists(self.drain_file)

    def admits(self, parameters: str) -> bool:
        """Whether a request with ``parameters`` (the JSON text of ``request.parameters()``) is the
        loop's, which a drain still serves."""
        if self.token is None:
            return True
        try:
            sent = json.loads(parameters or "{}")
        except ValueError:
            return False
        return isinstance(sent, dict) and sent.get(LOOP_CALL_PARAMETER) == self.token

    def refusal(self) -> str:
        return (
            f"{self.model}: the server is draining (shutting down): new requests are refused and only those in flight "
            "finish; send it to another replica"
        )
