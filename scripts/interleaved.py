"""AR and TokenSwift timed side by side in one process, step for step, on the same prompts and seeds.

Run after run, this 2-core machine's speed drifts by ±10% (the other core's load, clock changes), which is more
than what the last few percent of a speculation overhead are worth. Alternating the two methods' steps puts
both under the same conditions at every moment, so their ratio is stable where two separate runs are not.

    .venv/bin/python scripts/interleaved.py --tokens 1024 --prompt 1 --sample          # one sequence each
    .venv/bin/python scripts/interleaved.py --tokens 512 --batch 8 --sample             # B=8 batches each

Prints one line: the seconds each method spent in its own steps, the AR / TokenSwift ratio (> 1: TokenSwift is
faster), and whether every sequence's tokens are the same (greedy, or seeded sampling with the same seeds).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from typing import Any

import torch

import longswift
from longswift import GenerationRequest, SamplingConfig
from longswift.bench.prompts import load_prompts


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=1024, help="new tokens per sequence")
    p.add_argument("--prompt", type=int, default=0, help="index of the first held-out prompt")
    p.add_argument("--prompt-len", type=int, default=256, help="prompt tokens (the prompt's first ones)")
    p.add_argument("--batch", type=int, default=0, help="B > 0: batches of B prompts (stream_many) instead")
    p.add_argument("--sample", action="store_true", help="the paper's sampling (default greedy)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    engine = longswift.load()
    sampling = SamplingConfig.paper() if args.sample else SamplingConfig()
    count = max(args.batch, 1)
    held_out = load_prompts(engine.tokenizer, None, args.prompt_len, args.prompt + count)  # the embedded prompts
    prompts = held_out.ids[args.prompt :]
    runs: dict[str, Any] = {}
    for mode in ("ar", "tokenswift"):
        requests = [
            GenerationRequest(ids, args.tokens, sampling, seed=i, mode=mode, ignore_eos=True)
            for i, ids in enumerate(prompts)
        ]
        runs[mode] = engine.stream_many(requests, batch_size=args.batch) if args.batch else engine.stream(requests[0])
    seconds = interleave({mode: iter(stream) for mode, stream in runs.items()})
    if args.batch:
        ids = {mode: [r.token_ids for r in stream.results] for mode, stream in runs.items()}
    else:
        ids = {mode: [stream.result.token_ids] for mode, stream in runs.items()}
    kind = f"B={args.batch} batches" if args.batch else "one sequence"
    print(
        f"{'sampled' if args.sample else 'greedy'}, {kind}, prompt {args.prompt}, {args.tokens} tokens: "
        f"AR {seconds['ar']:.2f} s, TokenSwift {seconds['tokenswift']:.2f} s, "
        f"ratio {seconds['ar'] / seconds['tokenswift']:.3f}, same tokens: {ids['ar'] == ids['tokenswift']}"
    )


def interleave(streams: dict[str, Iterator[Any]]) -> dict[str, float]:
    """Advance each stream by one item in turn until all end -> seconds spent inside each stream's steps."""
    seconds = dict.fromkeys(streams, 0.0)
    live = dict(streams)
    while live:
        for mode, stream in list(live.items()):
            t0 = time.perf_counter()
            try:
                next(stream)
            except StopIteration:
                del live[mode]
            seconds[mode] += time.perf_counter() - t0
    return seconds


if __name__ == "__main__":
    main()
