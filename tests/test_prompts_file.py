"""generate-batch's prompts file as users write it (issue 40): a byte that is not UTF-8 costs only its own line (an
error naming that line), a byte-order mark costs nothing, and results.jsonl names the heads without an absolute
path."""

from __future__ import annotations

import codecs
import io
import json
import shutil
from pathlib import Path

import pytest

from longswift.cli import main
from longswift.errors import PromptError
from longswift.jobs.batch import read_prompts
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
