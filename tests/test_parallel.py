"""Tensor parallelism over torch.distributed (gloo, CPU processes started by torchrun) and sharded batch jobs.

TP=2 must reproduce TP=1: greedy AR and TokenSwift token for token (a difference is allowed only where the
classified cause is a numerical near-tie, since the all-reduce sums partial products in another order), seeded
sampling alike, with half the weights per rank; every rank of a group must decide the same tokens.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import longswift
from longswift import SamplingConfig
from longswift.bench.identity import NEAR_TIE_FP32, compare
from longswift.cli import main
from longswift.jobs.state import JobState
from longswift.model.checkpoint import Checkpoint
from longswift.parallel import TensorParallel, shard_config, valid_splits
from longswift.parallel.tensor import _shard

from .test_tokenswift import random_heads

HERE = Path(__file__).parent
ENV = {
    **os.environ,
    "OMP_NUM_THREADS": "1",
    "PYTHONPATH": os.pathsep.join([str(HERE.parent / "src"), os.environ.get("PYTHONPATH", "")]),
}
PROMPT = "It was the best of times"
# Lengths: every TP=2 token costs two gloo all-reduces per layer (most of this module's time on 2 shared cores);
# on CPUs the default speculation (fused drafting, no partial cache) has nothing that changes with the length
# below ~1,000 rows, where the cost model first recalibrates.
CASES = [
    {"mode": "ar", "sample": False, "n": 250},
    {"mode": "tokenswift", "sample": False, "n": 300},
    {"mode": "tokenswift", "sample": True, "n": 200, "seed": 3},
    {"mode": "ar", "sample": True, "n": 150, "seed": 4},
]


def torchrun(*argv: str, n: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(n), *argv]


def weight_bytes(model: torch.nn.Module) -> int:
    return sum({p.data_ptr(): p.numel() * p.element_size() for p in model.parameters()}.values())


TP_ARCHS = ["llama_gqa_llama3", "llama_mha"]


@pytest.fixture(scope="module")
def tp2_launch(checkpoint_factory, tiny_llama, tmp_path_factory) -> dict:
    """One torchrun launch of 2 ranks for the module: the CASES of every TP_ARCHS model (tp_worker.py), then the
    uninterrupted `longswift generate --tp 2` job that the SIGINT test resumes to. Each launch starts three
    interpreters (about 10 s here before any work), so the three runs share one.

    -> {"ranks": [rank0, rank1] (each {"models": [per arch], "commands": [exit statuses]}), "heads": {arch: path},
        "reference": (text file, checkpoint) of the generate job}."""
    out = tmp_path_factory.mktemp("tp2")
    models = {arch: checkpoint_factory(arch) for arch in TP_ARCHS}
    heads = {arch: random_heads(path, 0) for arch, path in models.items()}
    reference = (out / "ref.txt", out / "ref.json")
    spec = {
        "models": [
            {"model": str(models[arch]), "heads": heads[arch], "prompt": PROMPT, "cases": CASES} for arch in TP_ARCHS
        ],
        "commands": [generate_tp2_args(tiny_llama, random_heads(tiny_llama, 0), *reference)],
        "out": str(out),
    }
    proc = subprocess.run(
        torchrun(str(HERE / "tp_worker.py"), json.dumps(spec)),
        env=ENV,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert [r["commands"] for r in ranks] == [[0], [0]], proc.stderr[-3000:]
    return {"ranks": ranks, "heads": heads, "reference": reference}


@pytest.mark.parametrize("arch", TP_ARCHS)
def test_tp2_equals_tp1_with_half_the_weights_per_rank(arch, checkpoint_factory, tp2_launch):
    model = checkpoint_factory(arch)
    heads = tp2_launch["heads"][arch]
    ranks = [r["models"][TP_ARCHS.index(arch)] for r in tp2_launch["ranks"]]

    engine = longswift.load(model, heads=heads, device="cpu", dtype="fp32")
    full = engine.checkpoint.config
    assert all(r["kv_heads"] == full.num_kv_heads // 2 for r in ranks)  # each rank caches only its KV heads
    for r in ranks:  # measured: the embeddings are split too (they are a third of these tiny models)
        assert r["weight_bytes"] <= 0.55 * weight_bytes(engine.model), (r["weight_bytes"], weight_bytes(engine.model))
    for case, run0, run1 in zip(CASES, ranks[0]["runs"], ranks[1]["runs"]):
        assert run0["tokens"] == run1["tokens"], f"ranks decided differently in {case}"
        sampling = SamplingConfig.paper() if case["sample"] else SamplingConfig(temperature=0)
        ref = engine.generate(
            PROMPT,
            case["n"],
            sampling=sampling,
            seed=case.get("seed"),
            mode=case["mode"],
            ignore_eos=True,
            record_margins=True,
        )
        comparison = compare(ref.token_ids, run0["tokens"], ref.margins, NEAR_TIE_FP32)
        # Only a classified numerical near-tie may separate the runs; on these models none occurred.
        assert comparison.kind in ("identical", "near-tie"), f"{arch} {case}: {comparison.describe()}"
        assert len(run0["tokens"]) == case["n"]


def test_shards_reassemble_the_stored_weights(tiny_llama):
    """Every rank's slice, put back together, is exactly the stored tensor (q/k/v by heads, o/down by columns,
    vocabulary rows with the last rank zero-padded)."""
    from safetensors import safe_open

    ckpt = Checkpoint.open(tiny_llama)
    n = 2
    with safe_open(str(ckpt.weight_files[0]), framework="pt") as f:
        for name in f.keys():
            parts = [_shard(name, f.get_slice(name), TensorParallel(n, r, lead=0)) for r in range(n)]
            whole = f.get_tensor(name)
            dim = 1 if name.endswith(("o_proj.weight", "down_proj.weight")) else 0
            joined = torch.cat(parts, dim) if parts[0].shape != whole.shape else parts[0]
            assert torch.equal(joined[: whole.shape[0]], whole), name
    local = shard_config(ckpt.config, n)
    assert (local.num_heads, local.num_kv_heads, local.group_size) == (3, 1, ckpt.config.group_size)


def test_invalid_splits_are_refused_before_loading(tiny_llama, tmp_path):
    assert valid_splits(Checkpoint.open(tiny_llama).config) == [1, 2]  # 6 heads, 2 KV heads
    err = io.StringIO()
    code = main(["generate", "--model", str(tiny_llama), "--prompt", "x", "--tp", "4"], err=err)
    assert code == 2 and err.getvalue() == (
        "longswift: error: --tp 4 cannot split this model: num_attention_heads=6 "
        "is not divisible by 4; valid --tp values: 1, 2\n"
    )
    err = io.StringIO()
    code = main(["generate", "--model", str(tiny_llama), "--prompt", "x", "--tp", "2"], err=err)
    assert code == 2 and "needs a multiple of 2 processes" in err.getvalue() and "torchrun" in err.getvalue()


def test_dry_run_from_config_json_alone_with_a_per_rank_plan(tiny_llama, tmp_path):
    (tmp_path / "config.json").write_text((tiny_llama / "config.json").read_text())  # no weights, no tokenizer
    out = io.StringIO()
    assert (
        main(
            [
                "generate",
                "--model",
                str(tmp_path),
                "--prompt",
                "hello",
                "--max-new-tokens",
                "1000",
                "--dry-run",
                "--tp",
                "2",
            ],
            out=out,
            err=io.StringIO(),
        )
        == 0
    )
    text = out.getvalue()
    assert "per rank of --tp 2" in text and "--tp 1" in text and "smallest --tp that fits" in text
    assert "5 tokens at most" in text
    err = io.StringIO()
    assert main(["generate", "--model", str(tmp_path), "--prompt", "x", "--dry-run", "--tp", "3"], err=err) == 2
    assert "cannot split" in err.getvalue()


def test_tp_size_mismatch_is_refused_on_resume(tiny_llama):
    engine = longswift.load(tiny_llama, heads=False, device="cpu", dtype="fp32")
    stream = engine.stream(PROMPT, 20, sampling=SamplingConfig(temperature=0), ignore_eos=True)
    for _ in stream:
        pass
    state = stream.snapshot()
    saved = JobState(**{**state.__dict__, "config": {**state.config, "tp": 2}})
    with pytest.raises(longswift.ResumeError, match="tensor-parallel size 2 but this run has --tp 1; resume it with"):
        engine.generate(PROMPT, 20, sampling=SamplingConfig(temperature=0), ignore_eos=True, resume=saved)


def generate_tp2_args(model: Path, heads: str, out: Path, ckpt: Path, *extra: str) -> list[str]:
    """`longswift generate --tp 2` arguments of the SIGINT test's job."""
    return [
        "generate",
        "--model",
        str(model),
        "--heads",
        heads,
        "--tp",
        "2",
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "250",
        "--ignore-eos",
        "--seed",
        "5",
        "--output",
        str(out),
        "--checkpoint",
        str(ckpt),
        "--checkpoint-every",
        "30",
        "--quiet",
        *extra,
    ]


def generate_tp2(*args) -> list[str]:
    return torchrun("-m", "longswift", *generate_tp2_args(*args))


def test_sigint_and_resume_at_tp2_equals_an_uninterrupted_run(tiny_llama, tmp_path, tp2_launch):
    """The uninterrupted TP=2 reference ran in the module's shared launch (tp2_launch)."""
    heads = random_heads(tiny_llama, 0)
    ref_out, ref_ckpt = tp2_launch["reference"]
    out, ckpt = tmp_path / "out.txt", tmp_path / "job.json"
    proc = subprocess.Popen(generate_tp2(tiny_llama, heads, out, ckpt), env=ENV, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while _tokens(ckpt) < 60 and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)  # torchrun passes it on to both ranks
    _, stderr = proc.communicate(timeout=120)
    stopped_at = _tokens(ckpt)
    assert 0 < stopped_at < 250, stderr[-2000:]
    assert out.read_text(encoding="utf-8") == JobState.load(ckpt).text
    assert JobState.load(ckpt).config["tp"] == 2
    err = io.StringIO()  # a TP=2 checkpoint is refused at TP=1, in one line
    code = main(
        [
            "generate",
            "--model",
            str(tiny_llama),
            "--heads",
            heads,
            "--prompt",
            PROMPT,
            "--max-new-tokens",
            "250",
            "--ignore-eos",
            "--seed",
            "5",
            "--output",
            str(tmp_path / "x.txt"),
            "--checkpoint",
            str(ckpt),
            "--resume",
            "--quiet",
        ],
        out=io.StringIO(),
        err=err,
    )
    assert code == 2 and "resume it with --tp 2" in err.getvalue() and err.getvalue().count("\n") == 1
    run_ok(generate_tp2(tiny_llama, heads, out, ckpt, "--resume"))
    assert JobState.load(ckpt).generated_ids == JobState.load(ref_ckpt).generated_ids
    assert out.read_bytes() == ref_out.read_bytes()


def run_ok(command: list[str]) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(command, env=ENV, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _tokens(path: Path) -> int:
    try:
        return len(JobState.load(path).generated_ids)
    except Exception:
        return 0


BATCH = [
    {"id": "first", "prompt": "It was the best of times"},
    {"id": "second", "prompt": "To be, or not to be", "seed": 7},
    {"id": "bad", "prompt": "x" * 5000},  # longer than the model's 4,096 positions: fails alone
    {"prompt": "whether 'tis nobler in the mind", "max_new_tokens": 450},
    {"id": "fifth", "prompt": "the age of wisdom"},
]


def batch_argv(model: Path, heads: str, prompts: Path, out_dir: Path) -> list[str]:
    return [
        "generate-batch",
        "--model",
        str(model),
        "--heads",
        heads,
        "--prompts",
        str(prompts),
        "--out-dir",
        str(out_dir),
        "--max-new-tokens",
        "600",
        "--ignore-eos",
        "--seed",
        "1",
        "--checkpoint-every",
        "100",
        "--quiet",
    ]


def test_batch_over_two_processes_killed_and_rerun_equals_one_process(tiny_llama, tmp_path):
    heads = random_heads(tiny_llama, 0)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps(p) + "\n" for p in BATCH) + "{not json\n", encoding="utf-8")
    ref = tmp_path / "ref"
    assert main(batch_argv(tiny_llama, heads, prompts, ref), out=io.StringIO(), err=io.StringIO()) == 0

    out = tmp_path / "out"
    command = torchrun("-m", "longswift", *batch_argv(tiny_llama, heads, prompts, out))
    proc = subprocess.Popen(command, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while not (len(list(out.glob("*.result.json"))) >= 2 and any(_tokens(c) >= 100 for c in _unfinished(out))):
        assert proc.poll() is None and time.monotonic() < deadline, "the batch ended before it could be interrupted"
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=120)
    assert proc.returncode != 0 and not (out / "results.jsonl").exists()
    done_before = {p.name: p.read_bytes() for p in out.glob("*.result.json")}
    saved = {c.name.removesuffix(".ckpt.json"): _tokens(c) for c in _unfinished(out)}
    assert done_before and any(saved.values())

    rerun = run_ok(command)
    assert "6 prompts: 4 finished, 2 failed" in rerun.stdout
    for name, data in done_before.items():  # finished jobs were skipped, not run again
        assert (out / name).read_bytes() == data
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    ref_lines = [json.loads(line) for line in (ref / "results.jsonl").read_text().splitlines()]
    assert [line["id"] for line in lines] == ["first", "second", "bad", "line-4", "fifth", "line-6"]
    assert "prompt" in lines[2]["error"] and "4,096 positions" in lines[2]["error"]
    assert lines[5]["error"].startswith("line 6: not valid JSON")
    for line, ref_line in zip(lines, ref_lines):
        if "error" in line:
            assert line["error"] == ref_line["error"]
            continue
        assert (out / line["output"]).read_bytes() == (ref / ref_line["output"]).read_bytes(), line["id"]
        stem = line["output"].removesuffix(".txt")
        # nothing generated twice: an interrupted job continued from its checkpoint, the others from zero
        assert line["stats"]["resumed_tokens"] == saved.get(stem, 0), line["id"]
    assert lines[3]["tokens"] == 450 and lines[0]["tokens"] == 600


def _unfinished(out: Path) -> list[Path]:
    return [c for c in out.glob("*.ckpt.json") if not (out / c.name.replace(".ckpt.json", ".result.json")).exists()]


@pytest.mark.slow
@pytest.mark.parametrize("batched", [[], ["--batch-size", "3"]], ids=["one-at-a-time", "batch-size-3"])
def test_batch_with_tp2_groups_equals_one_process(tiny_llama, tmp_path, batched):
    """generate-batch combined with --tp: one group of 2 ranks runs every job; outputs as a single process's,
    also when the group decodes 3 jobs together."""
    heads = random_heads(tiny_llama, 0)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({**p, "max_new_tokens": 150}) + "\n" for p in BATCH), encoding="utf-8")
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert main(batch_argv(tiny_llama, heads, prompts, ref), out=io.StringIO(), err=io.StringIO()) == 0
    run_ok(torchrun("-m", "longswift", *batch_argv(tiny_llama, heads, prompts, out), "--tp", "2", *batched))
    lines = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [("error" in line) for line in lines] == [False, False, True, False, False]
    for line in lines:
        if "output" in line:
            assert (out / line["output"]).read_bytes() == (ref / line["output"]).read_bytes(), line["id"]


def test_an_uneven_vocabulary_is_padded_on_the_last_rank(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    weight = torch.arange(15, dtype=torch.float32).reshape(5, 3)  # 5 rows over 2 ranks: 3 + 2 (+ 1 zero row)
    save_file({"lm_head.weight": weight}, str(tmp_path / "w.safetensors"))
    with safe_open(str(tmp_path / "w.safetensors"), framework="pt") as f:
        parts = [
            _shard("lm_head.weight", f.get_slice("lm_head.weight"), TensorParallel(2, r, lead=0)) for r in range(2)
        ]
    assert [tuple(p.shape) for p in parts] == [(3, 3), (3, 3)]
    assert torch.equal(torch.cat(parts)[:5], weight) and not parts[1][2].any()
