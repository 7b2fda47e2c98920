"""n-gram table counts exactly with deterministic ties; the trie builds correct masks and positions."""

from __future__ import annotations

import torch

from longswift.decode.ngram import NGramTable
from longswift.decode.tree import Trie


def test_ngram_counts_are_exact_and_ties_keep_first_sight_order():
    table = NGramTable(4)
    table.add([1, 2, 3, 4, 1, 2, 3, 5])
    table.add([1, 2, 3, 4])  # continues across calls: (3,5,1,2), (5,1,2,3), (1,2,3,4) again
    assert table.count((1, 2, 3, 4)) == 2
    assert table.count((1, 2, 3, 5)) == 1
    assert table.count((3, 5, 1, 2)) == 1
    assert table.top_k(1, 5) == [(1, 2, 3, 4), (1, 2, 3, 5)]
    assert table.top_k(2, 5) == [(2, 3, 4, 1), (2, 3, 5, 1)]  # tie: first seen first
    assert table.top_k(9, 5) == [] and table.top_k(1, 0) == []
    assert len(table) == sum(len(table.top_k(t, 100)) for t in range(10))


def test_ngram_table_matches_brute_force_counting():
    g = torch.Generator().manual_seed(0)
    seq = torch.randint(0, 4, (500,), generator=g).tolist()
    table = NGramTable(3)
    for lo in range(0, 500, 37):
        table.add(seq[lo : lo + 37])
    brute: dict[tuple[int, ...], int] = {}
    for i in range(len(seq) - 2):
        brute[tuple(seq[i : i + 3])] = brute.get(tuple(seq[i : i + 3]), 0) + 1
    for gram, count in brute.items():
        assert table.count(gram) == count
    assert len(table) == len(brute)


def test_cartesian_tree_and_chain_merge():
    trie = Trie.rooted(7)
    trie.add_levels([[1], [2, 3], [4, 5]])
    assert len(trie) == 1 + 1 + 2 + 4
    trie.add_chain([1, 2, 4, 6])  # shares 3 nodes with the tree, adds one
    assert len(trie) == 9
    assert trie.from_tree[8] is False and all(trie.from_tree[:8])
    mask = trie.mask()
    for i in range(len(trie)):
        ancestors = {0, *trie.path(i)}
        assert set(mask[i].nonzero().flatten().tolist()) == ancestors
    assert trie.positions(100).tolist() == [100 + d for d in trie.depths]
