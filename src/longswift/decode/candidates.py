"""One step's candidate trie: the heads' draft levels, n-gram chains and the prompt-lookup continuation, merged.

Shared by single-sequence TokenSwift (tokenswift.py) and batched decoding (batched.py), so a sequence gets the
same candidates whichever decoder runs it. Every node is labelled with the sources that proposed it, for the
controller's acceptance estimates.
"""

from __future__ import annotations

from ..config import SpeculationConfig
from .controller import head_source, lookup_source, ngram_source
from .drafting import Draft
from .ngram import HistoryLookup, NGramTable
from .tree import Trie


def candidate_trie(
    decided: list[int],
    draft: Draft,
    ngrams: NGramTable,
    lookup: HistoryLookup,
    spec: SpeculationConfig,
    key: int | None,
    chains_from_root: bool,
) -> Trie:
    """The candidates below the root `decided[-1]`.

    `key`: the token the n-gram chains start with (None: no chains); `chains_from_root`: the key is the root,
    which is decided already, so a chain's first token is left out.
    """
    trie = Trie.rooted(decided[-1])
    trie.add_levels(
        draft.tokens, [[head_source(d + 1, r, p) for r, p in enumerate(row)] for d, row in enumerate(draft.probs)]
    )
    if key is not None and spec.ngram_topk:
        for rank, gram in enumerate(ngrams.top_k(key, spec.ngram_topk)):
            chain = gram[1:] if chains_from_root else gram
            share = ngrams.share(gram)
            trie.add_chain(chain, sources=[ngram_source(d + 1, rank, share) for d in range(len(chain))])
    if spec.lookup:
        found = lookup.continuation(decided, spec.lookup)
        trie.add_chain(found.tokens, sources=[lookup_source(d + 1, found.match) for d in range(len(found.tokens))])
    return trie
