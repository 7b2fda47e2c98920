"""The decoding layer: the AR baseline and TokenSwift, and the parts a speculation step is made of.

Modules: `loop` (prefill, the `Forward` / `Decoder` protocols, the AR decoder, `drive`), `tokenswift` (draft,
choose, verify, commit), `drafting` (the drafters), `controller` (which candidates pay), `tree` (the candidate
trie), `ngram` (token reuse), `verify` (the lossless walk), `sampling` (logits processing and the one draw),
`transcript` (what has been generated, stops) and `replay` (a synthetic drafter for measurements).
It sits on `longswift.model` and knows nothing of jobs, the API or front ends.
"""
