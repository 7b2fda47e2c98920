"""The embedded model's build tools: the Django corpus split, the held-out prompts, the resumable base-model
trainer and the quality measures. (The shipped model itself is tested in test_default_model.py.)"""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from tools.default_model import corpus, prompts, quality, train_base, training


def _doc(path: str, chars: int) -> corpus.Document:
    return corpus.Document(path, corpus.work_of(path), "x" * chars)


def test_units_are_packages_for_the_framework_and_apps_for_the_tests():
    assert corpus.work_of("django/db/models/query.py") == "django/db/models"
    assert corpus.work_of("django/db/models/fields/related.py") == "django/db/models"
    assert corpus.work_of("django/shortcuts.py") == "django"
    assert corpus.work_of("tests/admin_views/tests.py") == "tests/admin_views"
    assert corpus.work_of("tests/admin_views/sub/models.py") == "tests/admin_views"
    assert corpus.wanted("django/db/utils.py") and corpus.wanted("tests/runtests.py")
    assert not corpus.wanted("django/conf/locale/de/formats.py") and not corpus.wanted("docs/conf.py")
    assert not corpus.wanted("django/contrib/admin/static/admin/js/core.js")


def test_the_split_holds_out_whole_units_and_never_overshoots():
    docs = [_doc(f"tests/app{i}/{name}.py", 1000 + 10 * i) for i in range(40) for name in ("models", "tests")]
    train, valid = corpus.split_documents(docs, 0.1)
    held = {d.work for d in valid}
    assert held and not held & {d.work for d in train}  # a unit is wholly on one side
    total = sum(len(d.text) for d in docs)
    assert 0 < sum(len(d.text) for d in valid) <= 0.1 * total
    assert corpus.split_documents(docs, 0.1) == (train, valid)  # a fixed hash order, not random


def test_normalising_keeps_code_and_drops_what_is_not_text():
    assert corpus.normalise_text(b"def f():  \r\n    return 1\r\n\r\n") == "def f():\n    return 1\n"
    assert corpus.normalise_text(b"\xff\xfe not utf-8 \x80") is None


def test_prompts_come_from_held_out_units_in_line_aligned_windows(tmp_path):
    long_text = "".join(f"line {i}\n" for i in range(4000))
    rows = [
        {"id": "tests/a/x.py", "work": "tests/a", "text": long_text},
        {"id": "tests/b/y.py", "work": "tests/b", "text": "short\n" * 900},
        {"id": "tests/c/z.py", "work": "tests/c", "text": "tiny\n"},
    ]
    (tmp_path / "valid.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = prompts.write_prompts(tmp_path, tmp_path)
    got = [json.loads(line) for line in path.read_text().splitlines()]
    assert [g["source"] for g in got] == ["tests/a", "tests/a", "tests/b"]  # tests/c is below MIN_UNIT_CHARS
    assert all(g["text"].startswith("line ") and len(g["text"]) == prompts.WINDOW_CHARS for g in got[:2])
    assert got[2]["text"] == ("short\n" * 900)[: prompts.WINDOW_CHARS]


def test_a_resume_with_a_new_schedule_or_windows_is_recorded_as_a_stage(tmp_path):
    config, settings, stream = _tiny_training(tmp_path, 4)
    model, state = train_base.build_model(config, 1), tmp_path / "state"
    assert len(training.train(model, stream, settings, state)["stages"]) == 1
    longer = training.TrainSettings(**{**settings.__dict__, "steps": 6, "seq_len": 32, "batch_size": 1})
    run = training.train(model, stream, longer, state, resume=True)
    assert [(s["from_step"], s["settings"]["seq_len"]) for s in run["stages"]] == [(0, 16), (4, 32)]
    assert training.tokens_seen(run["stages"], run["steps_done"]) == 4 * 2 * 16 + 2 * 1 * 32
    again = training.TrainSettings(**{**longer.__dict__, "steps": 8, "log_every": 1, "save_every": 1})
    assert len(training.train(model, stream, again, state, resume=True)["stages"]) == 3  # only `steps` counts


def test_a_rerun_curriculum_records_no_stage_for_a_stage_already_finished(tmp_path):
    config, settings, stream = _tiny_training(tmp_path, 4)
    model, state = train_base.build_model(config, 1), tmp_path / "state"
    longer = training.TrainSettings(**{**settings.__dict__, "steps": 6, "seq_len": 32, "batch_size": 1})
    training.train(model, stream, settings, state, save_at_end=True)
    training.train(model, stream, longer, state, resume=True, save_at_end=True)
    rerun = training.train(model, stream, settings, state, resume=True)  # `build --resume`: stage 1 is done
    assert rerun["steps_done"] == 6 and [s["from_step"] for s in rerun["stages"]] == [0, 4]


def test_the_build_trains_the_shipped_base_curriculum_unless_told_what_to_train():
    stages = train_base.base_stages(training.TrainSettings())
    assert stages == list(train_base.BASE_CURRICULUM)
    assert [(s.steps, s.seq_len, s.batch_size, s.schedule_steps) for s in stages] == [
        (1200, 2048, 2, None),
        (1300, 2048, 2, 2000),
        (1800, 4096, 1, None),
    ]
    watched = train_base.base_stages(training.TrainSettings(max_minutes=30, log_every=5))
    assert [(s.steps, s.max_minutes, s.log_every) for s in watched] == [(1200, 30, 5), (1300, 30, 5), (1800, 30, 5)]
    smoke = training.TrainSettings(steps=5, warmup_steps=1)
    assert train_base.base_stages(smoke) == [smoke]


def test_line_stats_count_runs_of_one_line_and_of_blank_lines():
    stats = quality.line_stats("a\nb\nb\nb\n\n\nc\nb")
    assert stats["lines"] == 8 and stats["longest_repeated_line_run"] == 3 and stats["longest_blank_run"] == 2
    assert stats["most_common_line"] == "b" and stats["most_common_line_share"] == pytest.approx(4 / 8)
    assert stats["blank_share"] == pytest.approx(2 / 8)


def _tiny_training(tmp_path, steps: int):
    config = train_base.build_config(train_base.ModelShape(32, 64, 2, 2, 1), vocab_size=97, eos_id=0)
    settings = training.TrainSettings(
        steps=steps, seq_len=16, batch_size=2, warmup_steps=1, log_every=100, save_every=2, bf16=False
    )
    stream = torch.randint(0, 97, (4000,), generator=torch.Generator().manual_seed(0))
    return config, settings, stream


def test_an_interrupted_base_training_resumes_to_the_same_weights(tmp_path):
    config, settings, stream = _tiny_training(tmp_path, 6)
    straight = train_base.build_model(config, 1)
    training.train(straight, stream, settings)
    # A run that saves only at step 4 stands for one killed after step 4: its state dir holds step 4.
    state = tmp_path / "state"
    training.train(
        train_base.build_model(config, 1),
        stream,
        training.TrainSettings(**{**settings.__dict__, "save_every": 4}),
        state,
    )
    assert json.loads((state / "state.json").read_text())["progress"]["step"] == 4
    resumed = train_base.build_model(config, 7)  # other initial weights: all must come from the state
    assert training.train(resumed, stream, settings, state, resume=True)["steps_done"] == 6
    for (name, a), b in zip(straight.state_dict().items(), resumed.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["state"]  # no .tmp / .old left behind


def _saved_at_step_4(tmp_path):
    config, settings, stream = _tiny_training(tmp_path, 6)
    state = tmp_path / "state"
    four = training.TrainSettings(**{**settings.__dict__, "save_every": 4})
    training.train(train_base.build_model(config, 1), stream, four, state)
    return config, settings, stream, state


def test_a_crash_between_the_saves_renames_resumes_from_the_previous_state(tmp_path, capsys):
    config, settings, stream, state = _saved_at_step_4(tmp_path)
    state.rename(tmp_path / "state.old")  # killed after moving the old state aside, before the new one moved in
    assert training.train(train_base.build_model(config, 7), stream, settings, state, resume=True)["steps_done"] == 6
    out = capsys.readouterr().out
    assert "restored" in out and f"resumed from {state} at step 4" in out  # not started over from step 0
    assert not (tmp_path / "state.old").exists()


@pytest.mark.parametrize("damage", ["state.json", "optimizer.safetensors", "model.safetensors"])
def test_a_damaged_training_state_is_one_line_that_names_it(tmp_path, damage):
    from longswift.errors import ResumeError

    config, settings, stream, state = _saved_at_step_4(tmp_path)
    target = state / damage
    target.write_bytes(target.read_bytes()[: len(target.read_bytes()) // 2])  # cut short
    with pytest.raises(ResumeError, match=r"cannot resume from .*state: damaged training state .*move it away"):
        training.train(train_base.build_model(config, 7), stream, settings, state, resume=True)


def test_build_threads_default_to_one_and_refuse_nonsense(monkeypatch):
    monkeypatch.delenv(train_base.THREADS_ENV, raising=False)
    assert train_base.build_threads() == 1
    monkeypatch.setenv(train_base.THREADS_ENV, "2")
    assert train_base.build_threads() == 2
    for bad in ("0", "two", "-1"):
        monkeypatch.setenv(train_base.THREADS_ENV, bad)
        with pytest.raises(SystemExit, match=train_base.THREADS_ENV):
            train_base.build_threads()


CARD = """# card

intro

## Training

hand-written provenance that no work dir holds

## Is it worth measuring on?

old figures

### The previous model (history)

kept figures

## Long generation

(not measured for this build)

## Sample

text

## Rebuild

how
"""


def test_a_card_splice_replaces_only_the_named_sections_and_keeps_their_history():
    from tools.default_model.card_sections import splice_sections

    rendered = (
        "# card\n\n## Training\n\nrendered\n\n## Is it worth measuring on?\n\nnew figures\n\n"
        "## Long generation\n\n- 100,000 tokens\n\n## Sample\n\nother\n"
    )
    card = splice_sections(CARD, rendered, ["Is it worth measuring on?", "Long generation"])
    assert "hand-written provenance" in card and "rendered" not in card  # not named: kept byte for byte
    assert "old figures" not in card and "new figures" in card and "- 100,000 tokens" in card
    assert card.index("new figures") < card.index("### The previous model (history)\n\nkept figures")
    assert card.index("kept figures") < card.index("## Long generation")
    assert card.endswith("## Sample\n\ntext\n\n## Rebuild\n\nhow\n")
    assert splice_sections(CARD, CARD, ["Is it worth measuring on?", "Long generation"]) == CARD
    # a section the card lacks goes before the sample; one the renderer lacks is an error, not a silent skip
    shorter = CARD.replace("## Long generation\n\n(not measured for this build)\n\n", "")
    assert splice_sections(shorter, rendered, ["Long generation"]) == CARD.replace(
        "(not measured for this build)", "- 100,000 tokens"
    )
    with pytest.raises(ValueError, match="no section 'Data'"):
        splice_sections(CARD, rendered, ["Data"])


def test_only_card_rerenders_the_long_run_section_of_the_shipped_card_and_keeps_the_rest(tmp_path):
    """`build --only-card` after long_run.py, on a copy of the shipped model and card with the committed raw
    metrics: the measured section is rendered from long_run.json, every other section stays as it was."""
    import shutil
    from pathlib import Path

    from tools.default_model import build

    from longswift.model.checkpoint import default_model_dir

    raw = Path(__file__).parents[1] / "docs" / "benchmarks" / "2026-12-06"
    work, out = tmp_path / "work", tmp_path / "model"
    work.mkdir()
    for name in ("train_metrics.json", "heads_metrics.json", "long_metrics.json", "long32_metrics.json"):
        shutil.copy(raw / "rebuild" / name, work / name)
    shutil.copy(raw / "long_run" / "long_run.json", work / "long_run.json")
    shutil.copytree(default_model_dir(), out, ignore=shutil.ignore_patterns("*.state"))
    before = (out / "MODEL_CARD.md").read_text(encoding="utf-8")
    build.main(["--only-card", "--card-sections", "Long generation", "--work", str(work), "--out", str(out)])
    after = (out / "MODEL_CARD.md").read_text(encoding="utf-8")
    section = after[after.index("## Long generation") : after.index("## Sample")]
    assert "100,000 tokens with TokenSwift" in section and "model fingerprint `6f1289688fe3f953`" in section
    assert after.replace(section, "") == before.replace(
        before[before.index("## Long generation") : before.index("## Sample")], ""
    )
    assert "(history)" in after and "## Rebuild" in after
    with pytest.raises(SystemExit):
        build.main(["--only-card", "--card-sections", " , ", "--work", str(work), "--out", str(out)])


def test_model_card_renders_the_frequency_penalised_greedy_continuation_beside_the_plain_one():
    from tools.default_model.model_card_long import long_quality_lines

    def greedy(penalty: str, share: float) -> dict:
        reading = {"repetition_share": share, "most_common_line_share": 0.03, "nonblank_lines": 900,
                   "most_common_line": "),"}  # fmt: skip
        return {"tokens": 20480, "penalty": penalty, "readings": {"20480": reading}}

    row = {"perplexity": 30.0, "top1": 0.4, "top1_share_of_2k": 1.0, "mean_top_probability": 0.45}
    long = {
        "chunks": 4,
        "chunk_tokens": 512,
        "positions": {"django": {"documents": 10, "scores": {"2048": row}, "reference_repetition_share": 0.59}},
        "greedy": greedy("1.2 over the last 1,024 tokens", 0.97),
        "greedy_frequency": greedy("1.2 over the last 1,024 tokens, frequency penalty 0.2 over the same", 0.37),
    }
    text = "\n".join(long_quality_lines(long))
    assert (
        "repetition share 97%" in text
        and "frequency penalty 0.2 over the same): first 20,480 tokens: repetition share 37%" in text
    )
    assert text.count("Held-out human code scores 59%") == 2


def test_model_card_says_what_the_heads_learnt_from():
    """Self-distilled heads (the build's default since 2026-12-07) and corpus-trained ones are described apart."""
    from tools.default_model.heads import HeadsSettings
    from tools.default_model.model_card import _heads_training_lines

    def lines(settings: HeadsSettings) -> str:
        metrics = {"settings": dataclasses.asdict(settings), "heads_bytes": 2**21, "steps_done": 5, "tokens_seen": 640,
                   "train_seconds": 1.0, "seconds_per_step": 0.2, "wall_seconds": 2.0, "final_train_loss": 9.5,
                   "command": "build", "valid_positions_scored": 256}  # fmt: skip
        return "\n".join(_heads_training_lines(metrics))

    distilled = lines(HeadsSettings())
    assert "Self-distilled" in distilled and "wrote 2,097,152 tokens under the paper's sampling" in distilled
    assert "on the training split" not in distilled
    corpus_trained = lines(HeadsSettings(self_distill=False))
    assert "Trained with `longswift.train.train_heads` on the training split" in corpus_trained
