"""The model layer: the transformer, its caches, checkpoints, draft heads and compiled forwards.

Modules: `transformer` (one Llama-family decoder and its attention), `rope`, `cache` (the full KV cache),
`partial_cache` (drafting's budgeted cache), `checkpoint` (reading a Hugging Face directory), `heads` (the
draft blocks), `released` (the authors' released checkpoints) and `compiled` (static-shape compiled forwards).
Nothing here knows about decoding, jobs or front ends. The transformer's names are re-exported here because
`longswift.model` was that module before the package existed.
"""

from .transformer import *  # noqa: F403  (the names and the list are transformer.py's: one list, kept there)
from .transformer import __all__ as __all__
