"""The embedded model's long-context tools: long documents, the curriculum, and the by-position measures."""

from __future__ import annotations

import argparse
import json

import pytest
import torch
from tools.default_model import long_context, long_docs, long_quality, train_base, training


def count_chars(text: str) -> int:
    return len(text)  # one "token" per character keeps the sizes readable


def test_long_documents_join_small_units_keep_order_and_cut_at_the_maximum():
    units = {
        "b": [("b/1.py", "x" * 30), ("b/2.py", "y" * 30)],
        "a": [("a/1.py", "z" * 10)],
        "c": [("c/1.py", "w" * 500)],
    }
    docs = long_docs.build_long_docs(units, count_chars, min_tokens=60, max_tokens=200)
    assert docs[0].units == ("a", "b")  # a alone is too short: joined with the next unit in name order
    assert docs[0].text.startswith("# a/1.py\n" + "z" * 10 + "\n\n# b/1.py\n")
    assert all(len(doc.text) <= 200 for doc in docs)
    assert "".join(doc.text for doc in docs[1:]).replace("\n", "").strip("#c/1.py ") == "w" * 500
    assert docs == long_docs.build_long_docs(dict(reversed(units.items())), count_chars, 60, 200)  # stable


def test_long_documents_keep_every_character_of_a_file_cut_into_pieces():
    text = "".join(f"line {i}\n" for i in range(200))
    pieces = list(long_docs.split_file(long_docs.file_block("f.py", text), count_chars, 300))
    assert len(pieces) > 1 and all(len(p) <= 300 for p in pieces)
    assert "".join(pieces) == long_docs.file_block("f.py", text)
    assert all(p.endswith("\n") for p in pieces)


def test_stdlib_units_leave_out_tests(tmp_path):
    (tmp_path / "email").mkdir()
    (tmp_path / "test").mkdir()
    (tmp_path / "email" / "parser.py").write_text("a = 1\n" * 50)
    (tmp_path / "test" / "test_email.py").write_text("b = 2\n" * 50)
    (tmp_path / "os.py").write_text("c = 3\n" * 50)
    (tmp_path / "short.py").write_text("d = 4\n")
    units = long_docs.stdlib_units(tmp_path)
    assert sorted(units) == ["stdlib/<top>", "stdlib/email"]
    assert [path for path, _ in units["stdlib/<top>"]] == ["Lib/os.py"]


def test_the_curriculum_is_one_schedule_over_its_stages():
    settings = long_context.LongSettings(stages=((64, 3), (128, 2)), lr=1e-3, warmup_steps=1)
    first, second = settings.stage_settings()
    assert (first.steps, first.seq_len, second.steps, second.seq_len) == (3, 64, 5, 128)
    lrs = [training.lr_at(step, first if step < 3 else second) for step in range(5)]
    assert lrs[1] == pytest.approx(1e-3) and all(a >= b for a, b in zip(lrs, lrs[1:]))  # no jump between stages
    assert lrs[4] < lrs[2] < lrs[1]
    assert long_context.parse_stages("8192:180,16384:110") == ((8192, 180), (16384, 110))
    for bad in ("8192", "a:b", "8192:0", ""):
        with pytest.raises(argparse.ArgumentTypeError):
            long_context.parse_stages(bad)


def test_the_32k_phase_is_pinned_as_the_steps_it_ran_of_a_longer_schedule():
    # Shipped: 42 steps of a 60-step cosine (a time limit stopped the run); pinned, the learning rate at each of
    # those steps is the one the shipped run used, and the schedule has not reached its end.
    (stage,) = long_context.LONG32.stage_settings()
    assert (stage.steps, stage.seq_len, stage.schedule_steps) == (42, 32768, 60)
    full = training.TrainSettings(**{**stage.__dict__, "steps": 60})
    assert [training.lr_at(s, stage) for s in range(42)] == [training.lr_at(s, full) for s in range(42)]
    assert training.lr_at(41, stage) > training.lr_at(59, full)
    assert long_context.metrics_file() == long_context.METRICS_FILE
    assert long_context.metrics_file(long_context.LONG32_TAG) == "long32_metrics.json"


def test_a_curriculum_stage_resumes_from_the_last_step_of_the_previous_one(tmp_path):
    config = train_base.build_config(train_base.ModelShape(32, 64, 2, 2, 1), vocab_size=97, eos_id=0)
    stream = torch.randint(0, 97, (4000,), generator=torch.Generator().manual_seed(0))
    settings = long_context.LongSettings(stages=((16, 3), (32, 2)), warmup_steps=1, save_every=2)
    first, second = (
        training.TrainSettings(**{**s.__dict__, "bf16": False, "log_every": 100}) for s in settings.stage_settings()
    )
    model, state = train_base.build_model(config, 1), tmp_path / "state"
    training.train(model, stream, first, state, save_at_end=True)
    assert json.loads((state / "state.json").read_text())["progress"]["step"] == 3  # not only the step-2 save
    run = training.train(model, stream, second, state, resume=True, save_at_end=True)
    assert run["steps_done"] == 5 and [s["from_step"] for s in run["stages"]] == [0, 3]


def test_repetition_share_counts_tokens_whose_4gram_was_seen_before():
    assert long_quality.repeated_share([1, 2, 3, 4, 5, 6, 7, 8], 0) == 0.0
    ids = [1, 2, 3, 4] * 3
    # 4-grams ending at index 3..11: the first three cycles' grams are new, from index 7 on all were seen.
    assert long_quality.repeated_share(ids, 0) == pytest.approx(5 / 9)
    assert long_quality.repeated_share(ids, 8) == 1.0


def test_line_shares_ignore_blank_lines():
    shares = long_quality.line_shares("a\n\n\nb\na\n  a\n")
    assert shares == {"nonblank_lines": 4, "most_common_line": "a", "most_common_line_share": 0.75}


def test_chunks_are_fixed_and_their_prefixes_come_from_other_documents():
    docs = [list(range(10_000 * i, 10_000 * i + 2000)) for i in range(1, 6)]
    pairs = long_quality.chunks_and_prefixes(docs, eos_id=0)
    assert len(pairs) == long_quality.CHUNKS
    for chunk, other in pairs:
        assert len(chunk) == long_quality.CHUNK_TOKENS
        assert not set(chunk) & set(other)  # the chunk's own document is not in its prefix stream


def test_the_card_renders_the_long_context_stages_and_the_scores_by_position():
    from tools.default_model.model_card_long import long_context_section, long_quality_lines

    long_metrics = {
        "settings": {"stages": [[8192, 180], [16384, 110]], "warmup_steps": 20, "lr": 6e-4, "seed": 4321},
        "documents": {
            "long_train.jsonl": {
                "documents": 112,
                "min_doc_tokens": 9000,
                "max_doc_tokens": 65000,
                "median_doc_tokens": 27000,
            }
        },
        "steps_done": 250,
        "stopped_early": True,
        "tokens_seen": 3_000_000,
        "train_seconds": 4500,
        "valid_loss_before": {"4096": 3.78, "16384": 3.94},
        "valid_loss_after": {"4096": 3.6, "16384": 3.5},
        "command": "python -m tools.default_model.long_context",
    }
    text = "\n".join(long_context_section(long_metrics))
    assert "180 steps of 1 x 8,192 tokens, then 110 steps of 1 x 16,384 tokens" in text
    assert "stopped at step 250 of 290" in text and "16,384-token windows 3.940 -> 3.500" in text
    long32 = {
        **long_metrics,
        "stopped_early": False,
        "steps_done": 42,
        "tokens_seen": 42 * 32768,
        "settings": {"stages": [[32768, 42]], "schedule_steps": 60, "warmup_steps": 6, "lr": 3e-4, "seed": 4321},
    }
    later = "\n".join(long_context_section(long_metrics, [long32]))
    assert "Then continued from that model" in later and "42 steps of 1 x 32,768 tokens" in later
    assert "42 steps of a 60-step schedule" in later and "warm-up 6 steps, peak learning rate 0.0003" in later
    row = {"perplexity": 40.0, "top1": 0.35, "top1_share_of_2k": 0.9, "mean_top_probability": 0.45}
    long = {
        "chunks": 4,
        "chunk_tokens": 512,
        "positions": {"django": {"documents": 10, "scores": {"2048": row}, "reference_repetition_share": 0.3}},
        "greedy": {
            "tokens": 100,
            "penalty": "1.2",
            "readings": {
                "8192": {
                    "repetition_share": 0.25,
                    "most_common_line_share": 0.02,
                    "nonblank_lines": 50,
                    "most_common_line": ")",
                }
            },
        },
    }
    table = "\n".join(long_quality_lines(long))
    assert "| position 2,048 | 40.0 | 0.350 | 90% | 0.450 |" in table
    assert "first 8,192 tokens: repetition share 25%" in table and "scores 30%" in table
    assert long_context_section(None)[-2].startswith("(none")
