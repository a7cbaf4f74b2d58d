"""The errors code of the runtime package raises on purpose (``trt_spec.errors`` re-exports them).

Standard library only: this module is loaded inside Triton's python-backend stub.
"""

from __future__ import annotations


class TrtSpecError(Exception):
    """Base class of every trt-spec error: a known failure with a message fit for a user."""


class GenerationParamsError(TrtSpecError, ValueError):
    """A generation request has a bad parameter (temperature, top_p, max tokens, K, prompt, ...)."""


class ModelParametersError(TrtSpecError, ValueError):
    """A model's config.pbtxt parameters do not fit its typed definition (names the model, the
    key and the fix)."""
