"""The model layer: the transformer, its caches, checkpoints, draft heads and compiled forwards.

Modules: `transformer` (one Llama-family decoder and its attention), `rope`, `cache` (the full KV cache),
`partial_cache` (drafting's budgeted cache), `checkpoint` (reading a Hugging Face directory), `heads` (the
draft blocks), `released` (the authors' released checkpoints) and `compiled` (static-shape compiled forwards).
Nothing here knows about decoding, jobs or front ends. The transformer's names are re-exported here because
`longswift.model` was that module before the package existed.
"""

from .transformer import (
    CASCADE_MIN_WORK,
    MLP,
    Attention,
    Backbone,
    Cache,
    DecoderLayer,
    QueryLog,
    RMSNorm,
    Transformer,
    Visibility,
    attend,
    attention_bias,
    cascade_attention,
    merge_attention,
)

__all__ = [
    "CASCADE_MIN_WORK",
    "MLP",
    "Attention",
    "Backbone",
    "Cache",
    "DecoderLayer",
    "QueryLog",
    "RMSNorm",
    "Transformer",
    "Visibility",
    "attend",
    "attention_bias",
    "cascade_attention",
    "merge_attention",
]
