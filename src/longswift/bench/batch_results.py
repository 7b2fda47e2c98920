"""What the batch bench measured: one `BatchRun` per (method, batch size, length), each with its sequences'
identity against their batch-size-1 runs, and the paired ratios of aggregate throughput per (batch size, length).

The methods (`BATCH_METHODS`): longswift's AR and TokenSwift run sequentially (the B prompts one after another
with `Engine.stream`, batch size 1) and batched (`Engine.stream_many`), and transformers' batched `generate`.
Aggregate tokens/s is all B sequences' new tokens over the wall time of the whole run, prefills included;
per-sequence tokens/s is the mean over the sequences of each one's own decoding rate (prefill excluded).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from .identity import Comparison

AR_SEQ, AR_BATCH = "ar-sequential", "ar-batched"
TS_SEQ, TS_BATCH = "tokenswift-sequential", "tokenswift-batched"
HF_BATCH = "hf-batched"
BATCH_METHODS = (AR_SEQ, AR_BATCH, TS_SEQ, TS_BATCH, HF_BATCH)  # the order of the table and the timed runs

# What each run's tokens are compared with: a batched run with its own sequential run (the lossless check);
# sequential TokenSwift with sequential AR (also lossless); transformers with sequential AR (greedy only, reported).
REFERENCES = {AR_BATCH: AR_SEQ, TS_BATCH: TS_SEQ, TS_SEQ: AR_SEQ, HF_BATCH: AR_SEQ}
LOSSLESS = (AR_BATCH, TS_BATCH, TS_SEQ)  # runs whose differences fail the bench; transformers' never do

# name -> (numerator, denominator), ratios of aggregate tokens/s within one (batch size, length); the same of
# the aggregate without prefills in `decode_ratios`
RATIOS = {
    "batched_ar_vs_sequential_ar": (AR_BATCH, AR_SEQ),
    "batched_tokenswift_vs_batched_ar": (TS_BATCH, AR_BATCH),
    "batched_tokenswift_vs_sequential_tokenswift": (TS_BATCH, TS_SEQ),
    "batched_ar_vs_hf_batched": (AR_BATCH, HF_BATCH),
}

FULL_RATIOS = {"batched_tokenswift_vs_batched_ar": (TS_BATCH, AR_BATCH)}


@dataclass
class BatchSequence:
    """One sequence of a run: which prompt and seed, its rate, and how its tokens compare with its reference's."""

    index: int
    prompt: int  # index into the prompt set (prompts repeat, with other seeds, when B exceeds the set)
    seed: int
    new_tokens: int
    tokens_per_s: float  # its own decoding rate (the engine's per-sequence decode seconds; transformers': stream)
    mean_accepted: float | None = None  # tokens per step
    identity: str | None = None  # "identical", "near-tie", "mismatch", "unverified"; None: not compared
    first_diff: int | None = None
    margin_at_diff: float | None = None


@dataclass
class BatchRun:
    """One method on B prompts at one length."""

    method: str  # one of BATCH_METHODS
    batch_size: int
    gen_len: int
    wall_s: float  # the whole run, every prefill included
    new_tokens: int  # all sequences together
    aggregate_tokens_per_s: float
    per_sequence_tokens_per_s: float  # mean over the sequences
    mean_accepted: float | None
    sequences: list[BatchSequence]
    reference: str | None = None  # the method whose tokens these were compared with
    prefill_s: float = 0.0  # of that wall time, the prefills (transformers': prompt -> first token, as hf.py)
    decode_tokens_per_s: float = 0.0  # all new tokens / (wall - prefill): the aggregate without the prefills
    stats: dict[str, Any] = field(default_factory=dict)  # batched runs: the batch's counts (BatchStream.stats)

    def identity_counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for s in self.sequences:
            if s.identity is not None:
                counts[s.identity] = counts.get(s.identity, 0) + 1
        return counts

    @property
    def identical(self) -> bool | None:
        """All sequences identical to their reference's; None when not compared."""
        counts = self.identity_counts()
        return None if not counts else set(counts) == {"identical"}


@dataclass
class BatchSummary:
    """The paired ratios of aggregate tokens/s at one (batch size, length); None where a method did not run."""

    batch_size: int
    gen_len: int
    ratios: dict[str, float | None]
    decode_ratios: dict[str, float | None] = field(default_factory=dict)
    # the same of the batched runs' steps with all B rows decoding (stats "full_batch_tokens_per_s"): without
    # the tail a fixed set of jobs leaves, where the fastest have finished and few rows share each forward
    full_ratios: dict[str, float | None] = field(default_factory=dict)


@dataclass
class BatchReport:
    """Everything the batch bench measured (BenchReport.batch)."""

    batch_sizes: tuple[int, ...]
    runs: list[BatchRun] = field(default_factory=list)
    summaries: list[BatchSummary] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def run(self, method: str, batch_size: int, gen_len: int) -> BatchRun | None:
        return next(
            (r for r in self.runs if (r.method, r.batch_size, r.gen_len) == (method, batch_size, gen_len)), None
        )

    def lossless(self) -> bool | None:
        """False if any of longswift's sequences differed from its reference; transformers' are not counted."""
        checks = [r.identical for r in self.runs if r.method in LOSSLESS and r.identical is not None]
        return all(checks) if checks else None

    def summarize(self) -> None:
        self.summaries = []
        for gen_len in sorted({r.gen_len for r in self.runs}):
            for b in self.batch_sizes:
                ratios: dict[str, float | None] = {}
                decode: dict[str, float | None] = {}
                for name, (top, bottom) in RATIOS.items():
                    a, z = self.run(top, b, gen_len), self.run(bottom, b, gen_len)
                    ratios[name] = decode[name] = None
                    if a is not None and z is not None and z.aggregate_tokens_per_s > 0:
                        ratios[name] = a.aggregate_tokens_per_s / z.aggregate_tokens_per_s
                    if a is not None and z is not None and z.decode_tokens_per_s > 0:
                        decode[name] = a.decode_tokens_per_s / z.decode_tokens_per_s
                full: dict[str, float | None] = {}
                for name, (top, bottom) in FULL_RATIOS.items():
                    a, z = self.run(top, b, gen_len), self.run(bottom, b, gen_len)
                    ra = a.stats.get("full_batch_tokens_per_s") if a is not None else None
                    rz = z.stats.get("full_batch_tokens_per_s") if z is not None else None
                    full[name] = ra / rz if ra and rz else None
                self.summaries.append(BatchSummary(b, gen_len, ratios, decode, full))

    def to_dict(self) -> dict[str, Any]:
        return {
            "batch_sizes": list(self.batch_sizes),
            "lossless": self.lossless(),
            "notes": self.notes,
            "summaries": [asdict(s) for s in self.summaries],
            "runs": [
                {**asdict(r), "identical": r.identical, "identity_counts": r.identity_counts()} for r in self.runs
            ],
        }


def mark(seq: BatchSequence, comparison: Comparison) -> None:
    """Write a comparison's verdict into the sequence."""
    seq.identity, seq.first_diff = comparison.kind, comparison.first_diff
    seq.margin_at_diff = None if comparison.identical else comparison.margin
