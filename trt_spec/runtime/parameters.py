"""The model-config parameters of every python model: one typed definition per model.

Standard library only: this module is loaded inside Triton's python-backend stub.
"""

from __future__ import annotations

# The longest draft a spec may ask for (``speculative.num_draft_tokens``) and a request may send.
MAX_DRAFT_TOKENS = 16
