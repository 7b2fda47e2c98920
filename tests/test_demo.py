"""`longswift demo`: a marked excerpt, then the numbers; the whole text only with --show-text."""

from __future__ import annotations

import io

from longswift.cli import main
from longswift.cli.demo import EXCERPT_LINES, PROMPT_LINES, excerpt


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(list(argv), out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def test_excerpt_shows_the_first_lines_between_markers():
    text = "".join(f"line {i}\n" for i in range(100))
    shown = excerpt("FIRST\nPROMPT\nLAST\n", text).splitlines()
    assert shown[0].startswith("--- excerpt") and shown[-2].startswith("--- end of excerpt")
    assert "--show-text" in shown[-2]
    assert shown[1:-2] == ["PROMPT", "LAST"] + [f"line {i}" for i in range(EXCERPT_LINES)]


def test_excerpt_of_a_text_without_newlines_is_short():
    assert len(excerpt("p", "x" * 100_000)) < 1000


def test_demo_prints_an_excerpt_then_the_numbers():
    code, out, err = run("demo", "--max-new-tokens", "48", "--methods", "ar,tokenswift", "--device", "cpu")
    assert code == 0, err
    before, _, numbers = out.partition("--- end of excerpt")
    assert before.startswith("--- excerpt")
    assert "speedup over ar" in numbers and "outputs identical across methods: True" in numbers
    assert len(before.splitlines()) <= 1 + PROMPT_LINES + EXCERPT_LINES


def test_demo_show_text_prints_the_whole_generation(tiny_llama):
    code, out, err = run(
        "demo",
        "--model",
        str(tiny_llama),
        "--max-new-tokens",
        "24",
        "--methods",
        "ar",
        "--prompt",
        "It was",
        "--show-text",
        "--device",
        "cpu",
    )
    assert code == 0, err
    assert out.startswith("It was") and "--- excerpt" not in out
    assert "ar:" in out and "tok/s" in out
