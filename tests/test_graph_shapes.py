"""How many static graph shapes (node bucket x key bucket) a 100K-token run visits: on CUDA each is one recorded
CUDA graph (the first H200 run recorded 9 sizes in ~30 steps). Pure bucketing (compiled.graph_shapes), nothing
compiled; one check ties it to the shapes StaticForward actually chooses.

The bound: keys are bucketed with at most 1/8 padding, 8 buckets per doubling of the context, so a run from
4,096 to 104,096 cached rows (log2 ~ 4.7 doublings) visits at most 8 * 5 + 1 = 41 key buckets, and a TokenSwift
run at most that times the node buckets its tries use.
"""

from __future__ import annotations

import math
import random

import longswift
from longswift.model.cache import KVCache
from longswift.model.compiled import NODE_BUCKETS, StaticForward, graph_shapes

START, END = 4096, 104_096
CAPACITY = END + 300
KEY_BOUND = 8 * math.ceil(math.log2(END / START)) + 1  # 41


def tokenswift_steps(seed: int) -> list[tuple[int, int]]:
    """(cached rows, verified nodes) per step: tries of every size the default shapes make, 1-5 tokens a step."""
    rng, steps, end = random.Random(seed), [], START
    while end < END:
        nodes = rng.choice([1, 2, 3, 5, 9, 17, 33, 41, 64, 100])
        steps.append((end, nodes))
        end += rng.randint(1, 5)
    return steps


def test_an_ar_run_to_100k_records_at_most_41_graphs():
    shapes = graph_shapes(((end, 1) for end in range(START, END)), CAPACITY)
    assert {nodes for nodes, _ in shapes} == {1}
    assert len(shapes) <= KEY_BOUND
    assert len(shapes) == 37  # today's bucketing, so that a change to it is seen here


def test_a_tokenswift_run_to_100k_stays_within_node_buckets_times_key_buckets():
    shapes = graph_shapes(tokenswift_steps(0), CAPACITY)
    node_buckets = {nodes for nodes, _ in shapes}
    assert node_buckets <= set(NODE_BUCKETS) and len({keys for _, keys in shapes}) <= KEY_BOUND
    assert len(shapes) <= len(node_buckets) * KEY_BOUND <= len(NODE_BUCKETS) * KEY_BOUND  # 8 x 41 = 328
    assert len(shapes) == 296  # 8 node buckets x 37 key buckets (tries of up to 100 nodes, 128's bucket)


def test_a_block_past_the_biggest_bucket_or_the_capacity_has_no_graph():
    assert graph_shapes([(100, 129), (CAPACITY - 10, 16)], CAPACITY) == set()


def test_the_shapes_are_the_ones_the_static_forward_chooses(tiny_llama):
    model = longswift.load(tiny_llama, heads=False, device="cpu", dtype="fp32").model
    cache = KVCache(model.cfg, 3000)
    for attention in ("bias", "split"):
        static = StaticForward(model, compiled=False, attention=attention)
        for end, nodes in tokenswift_steps(1)[::997]:
            cache.length = end % 2950  # some near the capacity: those run eagerly
            plan = static._plan(nodes, cache, None)
            assert graph_shapes([(cache.length, nodes)], 3000) == (set() if plan is None else {plan})
