"""The CLI runs end to end, and every bad input gets one clear line, a non-zero exit and no traceback."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import pytest

import longswift
from longswift import SamplingConfig
from longswift.cli import main


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_generate_streams_text_and_writes_stats(tiny_llama, tmp_path):
    stats = tmp_path / "stats.json"
    code, out, err = run(
        "generate",
        "--model",
        str(tiny_llama),
        "--prompt",
        "It was",
        "--max-new-tokens",
        "12",
        "--seed",
        "1",
        "--ignore-eos",
        "--stats-json",
        str(stats),
    )
    assert code == 0, err
    assert out.strip()
    data = json.loads(stats.read_text())
    assert data["new_tokens"] == 12 and data["mode"] == "ar"
    assert {"prefill_s", "decode_s", "tokens_per_s"} <= set(data)


def test_console_script_runs_as_a_subprocess(tiny_llama):
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "longswift",
            "generate",
            "--model",
            str(tiny_llama),
            "--prompt",
            "It was",
            "--max-new-tokens",
            "5",
            "--greedy",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "[ar] 5 tokens" in proc.stderr or "[ar]" in proc.stderr


def _broken_dirs(tmp_path, tiny_llama):
    empty = tmp_path / "empty"
    empty.mkdir()
    unsupported = tmp_path / "gpt2"
    unsupported.mkdir()
    (unsupported / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    return {
        "missing": (str(tmp_path / "nope"), "model directory not found"),
        "no_config": (str(empty), "config.json not found"),
        "unsupported": (str(unsupported), "unsupported architecture 'GPT2LMHeadModel'; supported: LlamaForCausalLM"),
    }


@pytest.mark.parametrize("case", ["missing", "no_config", "unsupported"])
def test_bad_model_directory(case, tmp_path, tiny_llama):
    path, message = _broken_dirs(tmp_path, tiny_llama)[case]
    code, out, err = run("generate", "--model", path, "--prompt", "hi")
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--prompt", "   "], "the prompt is empty"),
        (["--prompt", "x", "--temperature", "-0.5"], "temperature must be >= 0, got -0.5"),
        (["--prompt", "x", "--top-p", "0"], "top-p must be in (0, 1], got 0.0"),
        (["--prompt", "x", "--top-p", "1.5"], "top-p must be in (0, 1], got 1.5"),
        (["--prompt", "x", "--min-p", "1"], "min-p must be in [0, 1), got 1.0"),
        (["--prompt", "x", "--repetition-penalty", "0"], "repetition penalty must be > 0"),
        (["--prompt", "x", "--penalty-window", "-1"], "penalty window must be >= 0"),
        (["--prompt", "x", "--max-new-tokens", "0"], "max-new-tokens must be >= 1"),
        (["--prompt", "x", "--max-new-tokens", "5000"], "exceeds the model's 4,096 positions"),
        (["--prompt", "x", "--bogus"], "unrecognized arguments: --bogus"),
        (["--prompt", "x", "--temperature", "hot"], "invalid float value: 'hot'"),
        (["--prompt", "x", "--dtype", "fp8"], "unknown dtype 'fp8'"),
        (["--prompt", "x", "--draft", "both"], "invalid choice: 'both'"),
        (["--prompt", "x", "--candidates", "most"], "invalid choice: 'most'"),
        (["--prompt", "x", "--lookup", "-3"], "lookup must be in [0, 64] tokens, got -3"),
        (["--prompt", "x", "--lookup", "many"], "invalid int value: 'many'"),
    ],
)
def test_bad_flags(flags, message, tiny_llama):
    code, out, err = run("generate", "--model", str(tiny_llama), *flags)
    assert code == 2
    assert message in err and err.count("\n") == 1 and "Traceback" not in err


def test_prompt_longer_than_the_model_positions(tiny_llama, tmp_path):
    prompt = tmp_path / "long.txt"
    prompt.write_text("It was the best of times. " * 1200)
    code, _, err = run("generate", "--model", str(tiny_llama), "--prompt-file", str(prompt))
    assert code == 2
    assert "but the model supports 4,096 positions" in err and "Traceback" not in err


def test_prompt_file_problems(tiny_llama, tmp_path):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("café".encode("latin-1"))
    code, _, err = run("generate", "--model", str(tiny_llama), "--prompt-file", str(bad))
    assert code == 2 and "is not valid UTF-8: byte 0xE9 at line 1, byte 4 of the line" in err
    code, _, err = run("generate", "--model", str(tiny_llama), "--prompt-file", str(tmp_path / "none.txt"))
    assert code == 2 and "prompt file not found" in err


def test_unwritable_stats_path_fails_before_generating(tiny_llama, tmp_path):
    code, out, err = run(
        "generate", "--model", str(tiny_llama), "--prompt", "x", "--stats-json", str(tmp_path / "no" / "dir" / "s.json")
    )
    assert code == 2 and "cannot write" in err and out == ""


def test_corrupt_weights_and_config(tiny_llama, tmp_path):
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(tiny_llama, broken)
    weights = broken / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    code, _, err = run("generate", "--model", str(broken), "--prompt", "x")
    assert code == 2 and "corrupt weights file model.safetensors" in err and "Traceback" not in err
    (broken / "config.json").write_text("{not json")
    code, _, err = run("generate", "--model", str(broken), "--prompt", "x")
    assert code == 2 and "config.json" in err and "not valid JSON" in err


def test_train_heads_end_to_end_then_generate_with_them(tiny_llama, tmp_path):
    data = tmp_path / "data.txt"
    data.write_text("It was the best of times, it was the worst of times. " * 100)
    heads = tmp_path / "heads.safetensors"
    code, out, err = run(
        "train-heads",
        "--model",
        str(tiny_llama),
        "--data",
        str(data),
        "--out",
        str(heads),
        "--steps",
        "4",
        "--seq-len",
        "64",
        "--quiet",
    )
    assert code == 0, err
    assert "wrote" in out and heads.exists()
    stats = tmp_path / "s.json"
    code, _, err = run(
        "generate",
        "--model",
        str(tiny_llama),
        "--heads",
        str(heads),
        "--prompt",
        "It was",
        "--max-new-tokens",
        "20",
        "--greedy",
        "--ignore-eos",
        "--stats-json",
        str(stats),
    )
    assert code == 0, err
    assert json.loads(stats.read_text())["mode"] == "tokenswift"


def test_train_heads_bad_inputs(tiny_llama, tmp_path):
    code, _, err = run(
        "train-heads",
        "--model",
        str(tiny_llama),
        "--data",
        str(tmp_path / "none.txt"),
        "--out",
        str(tmp_path / "h.safetensors"),
    )
    assert code == 2 and "not found" in err and "Traceback" not in err
    code, _, err = run("train-heads", "--model", str(tiny_llama), "--data", str(tmp_path / "none.txt"))
    assert code == 2 and "--out" in err


def test_missing_tokenizer_is_one_clear_line(tiny_llama, tmp_path):
    import shutil

    no_tok = tmp_path / "no_tokenizer"
    shutil.copytree(tiny_llama, no_tok)
    for f in no_tok.glob("tokenizer*"):
        f.unlink()
    code, _, err = run("generate", "--model", str(no_tok), "--prompt", "x")
    assert code == 2 and "cannot load the tokenizer" in err and err.count("\n") == 1 and "Traceback" not in err


def test_heads_for_another_model_via_the_cli(tiny_llama, checkpoint_factory):
    from .test_tokenswift import random_heads

    other = random_heads(checkpoint_factory("qwen2_bias"), 2)
    code, _, err = run("generate", "--model", str(tiny_llama), "--heads", other, "--prompt", "x")
    assert code == 2 and "trained for another model" in err and "Traceback" not in err
    code, _, err = run("generate", "--model", str(tiny_llama), "--heads", "/nonexistent/h.safetensors", "--prompt", "x")
    assert code == 2 and "heads file not found" in err


def test_unwritable_output_path(tiny_llama, tmp_path):
    code, out, err = run(
        "generate", "--model", str(tiny_llama), "--prompt", "x", "--output", str(tmp_path / "missing" / "out.txt")
    )
    assert code == 2 and "cannot write" in err and out == ""


def test_nan_logits_stop_the_job_with_one_line_and_keep_the_text(tiny_llama, tmp_path):
    """A model that turns NaN mid-generation (here: one poisoned embedding row) must not emit arbitrary tokens."""
    import shutil

    from safetensors.torch import load_file, save_file

    from .test_tokenswift import random_heads

    prompt = "It was the best of times"
    engine = longswift.load(tiny_llama, device="cpu")
    prompt_ids = engine.encode(prompt)
    clean = engine.generate(prompt, 40, sampling=SamplingConfig(), mode="ar", ignore_eos=True).token_ids
    # The first generated token not seen before: feeding it back is the first forward that sees the NaN row.
    i = next(i for i, t in enumerate(clean) if i >= 3 and t not in prompt_ids and t not in clean[:i])
    poisoned = tmp_path / "poisoned"
    shutil.copytree(tiny_llama, poisoned)
    weights = load_file(poisoned / "model.safetensors")
    weights["model.embed_tokens.weight"][clean[i]] = float("nan")
    save_file(weights, poisoned / "model.safetensors", metadata={"format": "pt"})

    out = tmp_path / "out.txt"
    greedy = ("--greedy", "--repetition-penalty", "1", "--max-new-tokens", "40", "--ignore-eos", "--quiet")
    code, _, err = run(
        "generate", "--model", str(poisoned), "--mode", "ar", "--prompt", prompt, *greedy, "--output", str(out)
    )
    assert code == 2 and "NaN or infinite logits" in err and err.count("\n") == 1 and "Traceback" not in err
    # Everything emitted before the NaN is on disk (a trailing incomplete UTF-8 character is still held back).
    assert out.read_text(encoding="utf-8") == engine.tokenizer.decode(clean[: i + 1]).rstrip("\ufffd")

    # TokenSwift may meet the poisoned token earlier (as a rejected candidate); it too stops cleanly.
    heads = random_heads(tiny_llama, 2)
    code, _, err = run(
        "generate",
        "--model",
        str(poisoned),
        "--heads",
        heads,
        "--mode",
        "tokenswift",
        "--prompt",
        prompt,
        *greedy,
        "--output",
        str(out),
    )
    assert code == 2 and "NaN or infinite logits" in err and "Traceback" not in err
    assert engine.tokenizer.decode(clean[: i + 1]).startswith(out.read_text(encoding="utf-8"))


def test_fused_drafting_refuses_a_tree_deeper_than_the_heads(tiny_llama):
    from .test_tokenswift import random_heads

    code, _, err = run(
        "generate",
        "--model",
        str(tiny_llama),
        "--heads",
        random_heads(tiny_llama, 0),
        "--prompt",
        "x",
        "--draft",
        "fused",
        "--tree",
        "1,1,1,1",
        "--mode",
        "tokenswift",
    )
    assert code == 2 and "fused drafting gets only 3 levels" in err and err.count("\n") == 1


def test_speculation_flags_change_the_defaults_of_greedy_or_sampled_runs():
    from longswift.cli.main import build_parser
    from longswift.cli.options import speculation_from
    from longswift.config import SpeculationConfig

    def spec(*flags: str, sampled: bool) -> SpeculationConfig:
        args = build_parser().parse_args(["generate", "--prompt", "x", "--device", "cpu", *flags])
        return speculation_from(args, "cpu", sampled)

    assert spec(sampled=False) == SpeculationConfig.for_device("cpu")
    assert spec(sampled=True) == SpeculationConfig.for_device("cpu", sampled=True)
    assert spec(sampled=True).lookup == 0 and spec("--lookup", "16", sampled=True).lookup == 16
    assert spec("--ngram-topk", "0", sampled=False).ngram_topk == 0
