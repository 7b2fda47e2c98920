"""Prompt files as users write them (issue 40). generate-batch's prompts file: a byte that is not UTF-8 costs only
its own line (an error naming that line), a byte-order mark costs nothing, and results.jsonl names the heads without
an absolute path. generate's --prompt-file: a leading byte-order mark is no part of the prompt, a byte that is not
UTF-8 is one line naming the file, the line and the byte; --stats-json names the heads as results.jsonl does."""

from __future__ import annotations

import codecs
import io
import json
import shutil
from pathlib import Path

import pytest

from longswift.cli import main
from longswift.errors import PromptError
from longswift.inputs import prompt_file_text
from longswift.jobs.batch import read_prompts
from longswift.jobs.result import portable_stats
from longswift.model.checkpoint import default_model_dir


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(data)
    return path


def test_a_latin1_byte_fails_its_own_line_only(tmp_path):
    data = b'{"id": "a", "prompt": "one"}\n{"id": "x", "prompt": "caf\xe9"}\n\xff\xfe junk\n{"prompt": "two"}\n'
    items = read_prompts(write(tmp_path, data))
    assert [(i.line, i.id, i.error is None) for i in items] == [
        (1, "a", True),
        (2, "x", False),
        (3, "line-3", False),
        (4, "line-4", True),
    ]
    assert items[1].error == (
        "line 2: not valid UTF-8 (byte 0xE9 at byte 27 of the line); save the file as UTF-8"
    )  # the byte's column in its line, not an offset into the file
    assert items[2].error is not None and items[2].error.startswith("line 3: not valid UTF-8 (byte 0xFF at byte 1 ")
    assert items[3].prompt == "two"


def test_a_bad_byte_in_the_id_falls_back_to_the_line_id(tmp_path):
    items = read_prompts(write(tmp_path, b'{"id": "b\xe9d", "prompt": "p"}\n{"id": "b\xe9d", "prompt": "q"}\n'))
    assert [i.id for i in items] == ["line-1", "line-2"] and all("not valid UTF-8" in str(i.error) for i in items)


def test_an_escaped_surrogate_is_still_a_lone_surrogate_error(tmp_path):
    (item,) = read_prompts(write(tmp_path, b'{"id": "s", "prompt": "a\\ud800"}\n'))
    assert item.id == "s" and "lone surrogate" in str(item.error) and "UTF-8 (byte" not in str(item.error)


def test_a_byte_order_mark_is_ignored(tmp_path):
    lines = b'{"id": "a", "prompt": "one"}\r\n{"id": "b", "prompt": "two"}\r\n'
    items = read_prompts(write(tmp_path, codecs.BOM_UTF8 + lines + codecs.BOM_UTF8 + b'{"prompt": "three"}\n'))
    assert [(i.id, i.prompt, i.error) for i in items] == [
        ("a", "one", None),
        ("b", "two", None),
        ("line-3", "three", None),
    ]


def test_a_utf16_file_is_refused_whole_with_what_to_do(tmp_path):
    path = write(tmp_path, '{"prompt": "one"}\n'.encode("utf-16"))
    with pytest.raises(PromptError, match="is UTF-16 .*; save it as UTF-8"):
        read_prompts(path)


def test_lines_are_numbered_as_before(tmp_path):
    """Line breaks are those of the decoded text (str.splitlines), as before: a bad byte never merges or splits."""
    items = read_prompts(write(tmp_path, b'{"prompt": "a"}\n\n{"prompt": "\xe9"}\r\n{"prompt": "c"}\n'))
    assert [(i.line, i.error is None) for i in items] == [(1, True), (3, False), (4, True)]


@pytest.mark.parametrize("batch_size", ["1", "2"])
def test_batch_runs_every_other_line_and_names_the_heads_relatively(batch_size, tmp_path):
    model = shutil.copytree(default_model_dir(), tmp_path / "model")
    (model / "sub").mkdir()
    shutil.move(model / "heads.safetensors", model / "sub" / "heads.safetensors")
    outside = shutil.copy(model / "sub" / "heads.safetensors", tmp_path / "mine.safetensors")
    data = codecs.BOM_UTF8 + b'{"id": "a", "prompt": "It was"}\n{"id": "x", "prompt": "caf\xe9"}\n{"prompt": "the"}\n'
    prompts = write(tmp_path, data)
    for heads, name in ((model / "sub" / "heads.safetensors", "sub/heads.safetensors"), (outside, "mine.safetensors")):
        out_dir = tmp_path / f"out-{name}"
        flags = ["--max-new-tokens", "3", "--greedy", "--quiet", "--mode", "tokenswift", "--batch-size", batch_size]
        err = io.StringIO()
        argv = ["generate-batch", "--model", str(model), "--heads", str(heads), "--prompts", str(prompts)]
        code = main([*argv, "--out-dir", str(out_dir), *flags], out=io.StringIO(), err=err)
        assert code == 0 and "Traceback" not in err.getvalue(), err.getvalue()
        results = [json.loads(x) for x in (out_dir / "results.jsonl").read_text().splitlines()]
        assert [r["line"] for r in results] == [1, 2, 3]
        assert results[0]["tokens"] == 3 and results[2]["tokens"] == 3  # line 1 kept despite the BOM
        assert results[1] == {"id": "x", "line": 2, "error": results[1]["error"]}
        assert results[1]["error"].startswith("line 2: not valid UTF-8")
        assert results[0]["stats"]["heads"] == results[2]["stats"]["heads"] == name
        assert str(tmp_path) not in (out_dir / "results.jsonl").read_text()


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_prompt_file_drops_one_leading_byte_order_mark_only(tmp_path):
    bom = codecs.BOM_UTF8
    assert prompt_file_text(write(tmp_path, bom + b"It was\n")) == "It was\n"
    assert prompt_file_text(write(tmp_path, bom + bom + b"It was")) == "\ufeffIt was"  # a second one is text
    assert prompt_file_text(write(tmp_path, b"It \xef\xbb\xbfwas")) == "It \ufeffwas"  # so is one further on


def test_generate_reads_a_prompt_file_with_a_bom_as_the_same_prompt(tiny_llama, tmp_path):
    flags = ("--model", str(tiny_llama), "--max-new-tokens", "8", "--greedy", "--ignore-eos", "--quiet")
    code, want, err = run("generate", "--prompt", "It was the best", *flags)
    assert code == 0, err
    prompt = write(tmp_path, codecs.BOM_UTF8 + b"It was the best")
    code, got, err = run("generate", "--prompt-file", str(prompt), *flags)
    assert code == 0 and got == want, err


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (
            b"It was\nthe caf\xe9\n",
            "prompt file {path} is not valid UTF-8: byte 0xE9 at line 2, byte 8 of the line (byte 15 of the file); "
            "save it as UTF-8",
        ),
        (
            codecs.BOM_UTF8 + b"\xc3(",
            "prompt file {path} is not valid UTF-8: byte 0xC3 at line 1, byte 4 of the line (byte 4 of the file); "
            "save it as UTF-8",
        ),
        (
            "It was".encode("utf-16"),
            "prompt file {path} is UTF-16 (it starts with a UTF-16 byte-order mark); save it as UTF-8",
        ),
    ],
)
def test_a_prompt_file_that_is_not_utf8_is_one_line_naming_the_byte(data, message, tiny_llama, tmp_path):
    path = write(tmp_path, data)
    code, out, err = run("generate", "--model", str(tiny_llama), "--prompt-file", str(path), "--max-new-tokens", "2")
    assert code == 2 and out == ""
    assert err == f"longswift: error: {message.format(path=path)}\n"  # one line, no traceback


def test_portable_stats_names_the_heads_by_the_model_directory(tmp_path):
    model = tmp_path / "model"
    stats = {"mode": "tokenswift", "heads": str(model / "sub" / ".." / "sub" / "h.safetensors")}
    assert portable_stats(stats, model) == {"mode": "tokenswift", "heads": "sub/h.safetensors"}
    assert portable_stats({"heads": str(tmp_path / "h.safetensors")}, model) == {"heads": "h.safetensors"}
    assert stats["heads"].startswith(str(tmp_path))  # the input is not changed
    for same in ({"heads": "embedded"}, {"mode": "ar"}, {"heads": None}):
        assert portable_stats(same, model) == same


def test_generate_stats_json_names_the_heads_relatively(tmp_path):
    model = shutil.copytree(default_model_dir(), tmp_path / "model")
    (model / "sub").mkdir()
    shutil.move(model / "heads.safetensors", model / "sub" / "heads.safetensors")
    outside = shutil.copy(model / "sub" / "heads.safetensors", tmp_path / "mine.safetensors")
    stats = tmp_path / "stats.json"
    flags = ("--prompt", "It was", "--max-new-tokens", "3", "--greedy", "--quiet", "--mode", "tokenswift")
    for heads, name in ((model / "sub" / "heads.safetensors", "sub/heads.safetensors"), (outside, "mine.safetensors")):
        code, _, err = run("generate", "--model", str(model), "--heads", str(heads), *flags, "--stats-json", str(stats))
        assert code == 0, err
        assert json.loads(stats.read_text())["heads"] == name and str(tmp_path) not in stats.read_text()
