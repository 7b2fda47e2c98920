"""The authors' released checkpoint format: draft blocks embedded in the model directory run as our heads.

The fixture is built the way a user would share heads trained here: `train-heads` on a random checkpoint, then
`export-heads --out-dir` writes the base model plus `model.medusa_layers.*` and config.json `medusa_heads`.
"""

from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import longswift
from longswift import SamplingConfig, SpeculationConfig
from longswift.cli import main
from longswift.decode.drafting import Draft, _HeadsTop
from longswift.model.checkpoint import Checkpoint
from longswift.model.released import BLOCKS_FILE, load_embedded
from longswift.train import TrainConfig, train_heads

TEXT = "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of foolishness. "
PROMPT = "It was the best of times, it was the worst of times"
SPEC = SpeculationConfig(tree=(1, 2, 2, 2), ngram_topk=4, kv_budget=48, sink_tokens=4)
GREEDY = SamplingConfig(repetition_penalty=1.3, penalty_window=64)
LEAVES = ("input_layernorm.weight", "linear.weight", "post_layernorm.weight")


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def _trained_and_released(base: Path, root: Path) -> tuple[Path, Path]:
    """Heads trained by train-heads on `base`, and `base` rewritten in the released format with them."""
    data = root / "data.txt"
    data.write_text(TEXT * 40, encoding="utf-8")
    heads = root / "trained.safetensors"
    train_heads(
        TrainConfig(
            model=base,
            data=(data,),
            out=heads,
            steps=12,
            seq_len=64,
            batch_size=2,
            lr=5e-2,
            warmup=2,
            checkpoint_every=0,
        )
    )
    released = root / "released"
    code, _, err = run("export-heads", "--model", str(base), "--heads", str(heads), "--out-dir", str(released))
    assert code == 0, err
    return heads, released


@pytest.fixture(scope="module")
def released_llama(tiny_llama, tmp_path_factory) -> tuple[Path, Path, Path]:
    """(base model, trained heads file, released-format directory)."""
    heads, released = _trained_and_released(tiny_llama, tmp_path_factory.mktemp("released_llama"))
    return tiny_llama, heads, released


def test_the_released_directory_has_the_authors_layout(released_llama):
    base, _, released = released_llama
    config = json.loads((released / "config.json").read_text())
    assert config["medusa_heads"] == 3
    assert {k: v for k, v in config.items() if k != "medusa_heads"} == json.loads((base / "config.json").read_text())
    weight_map = json.loads((released / "model.safetensors.index.json").read_text())["weight_map"]
    blocks = {name for name, file in weight_map.items() if file == BLOCKS_FILE}
    assert blocks == {f"model.medusa_layers.{i}.{leaf}" for i in range(3) for leaf in LEAVES}
    assert not list(released.glob("random_heads_*"))  # stray heads files beside the base model stay behind
    # transformers still reads the base model out of it (the blocks are extra tensors it ignores).
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(released, dtype=torch.float32)
    assert torch.equal(hf.lm_head.weight, load_file(base / "model.safetensors")["lm_head.weight"])


def _recording_drafts(monkeypatch) -> list[Draft]:
    """Every draft either drafter makes (both pick their top tokens through `_HeadsTop.top`)."""
    drafts: list[Draft] = []
    original = _HeadsTop.top

    def top(self, logits, context, noise=None):
        drafts.append(original(self, logits, context, noise))
        return drafts[-1]

    monkeypatch.setattr(_HeadsTop, "top", top)
    return drafts


def _same_run(a: dict, b: dict) -> None:
    for key in ("steps", "mean_accepted", "acceptance_rate", "tokens_per_step", "ngram_share", "new_tokens"):
        assert a[key] == b[key], key


@pytest.mark.parametrize("arch", ["llama_gqa_llama3", "qwen3"])
def test_embedded_blocks_draft_exactly_like_the_heads_file_and_output_equals_ar(
    arch, checkpoint_factory, released_llama, tmp_path, monkeypatch
):
    if arch == "llama_gqa_llama3":
        base, heads, released = released_llama
    else:
        base = checkpoint_factory(arch)
        heads, released = _trained_and_released(base, tmp_path)
    embedded = longswift.load(released, device="cpu", dtype="fp32")  # no heads argument at all
    from_file = longswift.load(base, heads=heads, device="cpu", dtype="fp32")
    assert embedded.heads_source == "embedded" and embedded.heads_note is None
    assert embedded.heads.state_dict().keys() == from_file.heads.state_dict().keys()
    for name, tensor in embedded.heads.state_dict().items():
        assert torch.equal(tensor, from_file.heads.state_dict()[name]), name

    drafts = _recording_drafts(monkeypatch)
    got = embedded.generate(PROMPT, 300, sampling=GREEDY, ignore_eos=True, speculation=SPEC)  # mode auto
    embedded_drafts = list(drafts)
    drafts.clear()
    want = from_file.generate(PROMPT, 300, sampling=GREEDY, ignore_eos=True, speculation=SPEC)
    assert got.stats["mode"] == "tokenswift" and got.stats["heads"] == "embedded"
    assert want.stats["heads"] == str(heads)
    assert embedded_drafts == drafts and len(drafts) == got.stats["steps"]
    assert got.token_ids == want.token_ids
    _same_run(got.stats, want.stats)
    assert got.stats["mean_accepted"] > 1.2  # trained heads (and n-grams) do accept drafts
    ar = embedded.generate(PROMPT, 300, sampling=GREEDY, ignore_eos=True, mode="ar")
    assert got.token_ids == ar.token_ids


def test_cli_picks_up_embedded_blocks_and_an_explicit_heads_file_wins_and_says_so(released_llama, tmp_path):
    _, heads, released = released_llama
    stats = tmp_path / "s.json"
    common = (
        "--prompt",
        PROMPT,
        "--max-new-tokens",
        "24",
        "--greedy",
        "--ignore-eos",
        "--stats-json",
        str(stats),
        "--device",
        "cpu",
    )
    code, _, err = run("generate", "--model", str(released), *common)
    assert code == 0, err
    assert (
        json.loads(stats.read_text())["mode"] == "tokenswift" and json.loads(stats.read_text())["heads"] == "embedded"
    )
    assert "note" not in err
    other = tmp_path / "other.safetensors"
    shutil.copy(heads, other)
    code, _, err = run("generate", "--model", str(released), "--heads", str(other), *common)
    assert code == 0, err
    assert json.loads(stats.read_text())["heads"] == "other.safetensors"  # outside the model: its file name
    assert f"note: using heads file {other}, not the 3 draft blocks embedded in {released}" in err
    code, _, err = run("generate", "--model", str(released), "--mode", "ar", *common)
    assert code == 0 and json.loads(stats.read_text())["mode"] == "ar"
    assert longswift.load(released, heads=False, device="cpu").heads is None


def test_a_heads_file_beside_the_model_wins_over_embedded_blocks(released_llama, tmp_path):
    _, heads, released = released_llama
    beside = tmp_path / "beside"
    shutil.copytree(released, beside)
    shutil.copy(heads, beside / "heads.safetensors")
    engine = longswift.load(beside, device="cpu")
    assert engine.heads_source == str(beside / "heads.safetensors") and "3 draft blocks embedded" in engine.heads_note


def test_export_heads_round_trips_and_keeps_the_model_fingerprint(released_llama, tmp_path):
    base, heads, released = released_llama
    exported = tmp_path / "exported.safetensors"
    code, out, err = run("export-heads", "--model", str(released), "--out", str(exported))
    assert code == 0, err
    assert "3 draft heads" in out
    original, again = load_file(heads), load_file(exported)
    assert original.keys() == again.keys() and all(torch.equal(original[k], again[k]) for k in original)
    meta = longswift.load(base, heads=exported, device="cpu").heads.meta
    assert meta.fingerprint == Checkpoint.open(base).fingerprint() == Checkpoint.open(released).fingerprint()
    twice = tmp_path / "twice"
    code, _, err = run("export-heads", "--model", str(base), "--heads", str(exported), "--out-dir", str(twice))
    assert code == 0, err
    first, second = load_file(released / BLOCKS_FILE), load_file(twice / BLOCKS_FILE)
    assert first.keys() == second.keys() and all(torch.equal(first[k], second[k]) for k in first)


def test_export_heads_refusals_are_one_line(released_llama, checkpoint_factory, tmp_path):
    base, heads, released = released_llama
    foreign = checkpoint_factory("qwen2_bias")
    cases = [
        (("--model", str(base), "--out", str(tmp_path / "h.safetensors")), "holds no draft blocks"),
        (
            ("--model", str(released), "--heads", str(heads), "--out-dir", str(tmp_path / "x")),
            "already holds draft blocks",
        ),
        (
            ("--model", str(foreign), "--heads", str(heads), "--out-dir", str(tmp_path / "y")),
            "trained for another model",
        ),
        (("--model", str(base), "--heads", str(heads), "--out-dir", str(released)), "is not an empty directory"),
        (("--model", str(base), "--out-dir", str(tmp_path / "z")), "--out-dir needs --heads FILE"),
        (("--model", str(base), "--out", str(tmp_path / "o"), "--out-dir", str(tmp_path / "z")), "not allowed with"),
    ]
    for argv, message in cases:
        code, _, err = run("export-heads", *argv)
        assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, (argv, err)


def _mutated(released: Path, out: Path, tensors=None, config=None) -> Path:
    """A copy of `released` whose draft-block tensors and/or config.json were edited."""
    shutil.copytree(released, out)
    if tensors is not None:
        blocks = tensors(load_file(released / BLOCKS_FILE))
        save_file(blocks, out / BLOCKS_FILE)
        index = json.loads((out / "model.safetensors.index.json").read_text())
        index["weight_map"] = {k: v for k, v in index["weight_map"].items() if v != BLOCKS_FILE}
        index["weight_map"].update({name: BLOCKS_FILE for name in blocks})
        (out / "model.safetensors.index.json").write_text(json.dumps(index))
    if config is not None:
        raw = json.loads((out / "config.json").read_text())
        (out / "config.json").write_text(json.dumps(config(raw)))
    return out


def _without(name):
    return lambda t: {k: v for k, v in t.items() if k != name}


MALFORMED = {
    "missing_tensor": (
        dict(tensors=_without("model.medusa_layers.1.post_layernorm.weight")),
        "draft block 1 in {dir} lacks model.medusa_layers.1.post_layernorm.weight",
    ),
    "wrong_shape": (
        dict(
            tensors=lambda t: {
                **t,
                "model.medusa_layers.0.linear.weight": t["model.medusa_layers.0.linear.weight"][:, :64].contiguous(),
            }
        ),
        "model.medusa_layers.0.linear.weight in {dir} has shape (72, 64); hidden size 72 needs (72, 72)",
    ),
    "wrong_norm_shape": (
        dict(tensors=lambda t: {**t, "model.medusa_layers.2.input_layernorm.weight": torch.ones(8)}),
        "model.medusa_layers.2.input_layernorm.weight in {dir} has shape (8,)",
    ),
    "bias": (
        dict(tensors=lambda t: {**t, "model.medusa_layers.0.linear.bias": torch.zeros(72)}),
        "model.medusa_layers.0.linear.bias in {dir}: TokenSwift draft blocks have no bias terms",
    ),
    "unexpected": (
        dict(tensors=lambda t: {**t, "model.medusa_layers.0.gate.weight": torch.zeros(72)}),
        "unexpected tensor model.medusa_layers.0.gate.weight in {dir}",
    ),
    "fewer_declared": (
        dict(config=lambda c: {**c, "medusa_heads": 2}),
        "config.json says medusa_heads=2 but the weights in {dir} hold draft blocks 0, 1, 2",
    ),
    "more_declared": (
        dict(config=lambda c: {**c, "medusa_heads": 4}),
        "config.json says medusa_heads=4 but the weights in {dir} hold draft blocks 0, 1, 2",
    ),
    "undeclared": (
        dict(config=lambda c: {k: v for k, v in c.items() if k != "medusa_heads"}),
        "weights in {dir} hold 3 draft blocks (model.medusa_layers.*) but config.json has no medusa_heads",
    ),
    "no_tensors": (
        dict(tensors=lambda t: {"unrelated.weight": torch.zeros(1)}),
        "config.json says medusa_heads=3 but the weights in {dir} hold draft blocks none",
    ),
    "bad_count": (
        dict(config=lambda c: {**c, "medusa_heads": "three"}),
        "config.json has medusa_heads='three'; expected the number of draft blocks (>= 1)",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_released_checkpoints_are_refused_with_one_line(case, released_llama, tmp_path):
    edits, message = MALFORMED[case]
    bad = _mutated(released_llama[2], tmp_path / case, **edits)
    if case == "no_tensors":  # an unrelated tensor in the shard would itself be refused by the base model
        index = json.loads((bad / "model.safetensors.index.json").read_text())
        index["weight_map"].pop("unrelated.weight")
        (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    code, _, err = run("generate", "--model", str(bad), "--prompt", "x", "--max-new-tokens", "2", "--device", "cpu")
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert message.format(dir=bad) in err


def test_embedded_heads_fingerprint_is_stable_and_tells_heads_apart(released_llama, tmp_path):
    _, _, released = released_llama
    ckpt = Checkpoint.open(released)
    first = load_embedded(ckpt, "fp").fingerprint
    assert first == load_embedded(ckpt, "fp", dtype=torch.bfloat16).fingerprint
    nudged = _mutated(
        released,
        tmp_path / "nudged",
        tensors=lambda t: {**t, "model.medusa_layers.2.linear.weight": t["model.medusa_layers.2.linear.weight"] + 1e-3},
    )
    assert load_embedded(Checkpoint.open(nudged), "fp").fingerprint != first

    engine = longswift.load(released, device="cpu", dtype="fp32")
    stream = engine.stream(PROMPT, 20, sampling=GREEDY, ignore_eos=True, speculation=SPEC)
    pieces = iter(stream)
    next(pieces)
    state = stream.snapshot()
    resumed = longswift.load(released, device="cpu", dtype="fp32").generate(
        PROMPT, 20, sampling=GREEDY, ignore_eos=True, speculation=SPEC, resume=state
    )
    assert (
        resumed.token_ids == engine.generate(PROMPT, 20, sampling=GREEDY, ignore_eos=True, speculation=SPEC).token_ids
    )
    with pytest.raises(longswift.ResumeError, match="another heads"):
        longswift.load(nudged, device="cpu", dtype="fp32").generate(
            PROMPT, 20, sampling=GREEDY, ignore_eos=True, speculation=SPEC, resume=state
        )


def test_bench_runs_a_released_checkpoint_without_heads(released_llama, tmp_path):
    from longswift.bench import BenchConfig, parse_methods, run_bench

    _, _, released = released_llama
    cfg = BenchConfig(
        tuple(parse_methods("ar,tokenswift:tree=1-2,k=4,budget=32,sink=4")),
        (16,),
        tmp_path / "out",
        model=released,
        prompt_len=32,
        device="cpu",
        dtype="fp32",
        warmup_tokens=2,
        curve_points=10,
    )
    report = run_bench(cfg)
    assert report.environment["heads"] == "embedded"
    assert report.summary("tokenswift:tree=1-2,k=4,budget=32,sink=4", 16).identical is True
