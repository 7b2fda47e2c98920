"""Re-render some sections of an existing MODEL_CARD.md and keep the rest of it as it stands.

Why: the shipped card is more than what the renderer produces from one work dir. The shipped weights were trained
in resumed stages across sessions, so its Training and heads lines, its comparisons with earlier models and its
history subsections were written when each was measured, and no single work dir holds their inputs. Re-rendering
the whole card after a measurement (`build --only-card` once `long_run.py` or `quality.py` has run) dropped all of
that. A measurement should replace the section it measures, nothing else: `splice_sections` does that, and keeps a
replaced section's history subsections (`### ... (history)`), which are records of earlier models, not of this
measurement.
"""

from __future__ import annotations

from collections.abc import Sequence

# the sections a measurement tool writes (quality.py, long_run.py): what `build --only-card` re-renders by default
MEASURED_SECTIONS = ("Is it worth measuring on?", "Long generation")


def _blocks(text: str, marker: str) -> list[tuple[str, str]]:
    """Split `text` at lines starting with `marker` -> [(heading, block text)], the first heading "" (preamble)."""
    blocks: list[tuple[str, list[str]]] = [("", [])]
    for line in text.splitlines(keepends=True):
        if line.startswith(marker):
            blocks.append((line[len(marker) :].strip(), [line]))
        else:
            blocks[-1][1].append(line)
    return [(heading, "".join(lines)) for heading, lines in blocks]


def _history(block: str) -> str:
    """The `### ... (history)` subsections of one `## ` block, in order, verbatim."""
    return "".join(text for heading, text in _blocks(block, "### ")[1:] if heading.endswith("(history)"))


def _with_history(new: str, old: str) -> str:
    """The rendered block `new` followed by the history subsections of `old` that `new` does not already hold."""
    kept = "".join(text for heading, text in _blocks(_history(old), "### ")[1:] if f"### {heading}\n" not in new)
    if not kept:
        return new
    return new.rstrip("\n") + "\n\n" + kept.rstrip("\n") + "\n\n"


def splice_sections(existing: str, rendered: str, headings: Sequence[str]) -> str:
    """`existing` with each `## heading` block in `headings` replaced by `rendered`'s block of that heading.

    Every other block of `existing` stays byte for byte. A heading `existing` lacks is inserted before its
    "## Sample" section (the end of the measured part of the card), or at the end. A heading `rendered` lacks is
    an error: the renderer and the caller disagree about the card's sections.
    """
    fresh = dict(_blocks(rendered, "## ")[1:])
    missing = [h for h in headings if h not in fresh]
    if missing:
        raise ValueError(f"the rendered card has no section {missing[0]!r} (sections: {', '.join(fresh)})")
    old = _blocks(existing, "## ")
    present = {heading for heading, _ in old}
    out: list[str] = []
    for heading, text in old:
        if heading == "Sample":
            out += [_ending(fresh[h]) for h in headings if h not in present]
        out.append(_with_history(_ending(fresh[heading]), text) if heading in headings else text)
    if "Sample" not in present:
        out[-1] = _ending(out[-1])
        out += [_ending(fresh[h]) for h in headings if h not in present]
    return "".join(out)


def _ending(block: str) -> str:
    """A block ends with exactly one blank line, so that spliced blocks stay separated as rendered ones are."""
    return block.rstrip("\n") + "\n\n"
