"""Build the training corpus of the embedded default model from the `Django==5.2.8` source distribution.

Why Python source, and why this source: the first embedded model learnt pseudo-Shakespeare, which a 6M-parameter
model can barely predict (mean top-token probability 0.20 under the paper's sampling settings), so every
speed figure measured on it was either a blank-line loop (greedy) or noise (sampled). Source code is far more
predictable, and its greedy continuations are readable. Django's sdist on PyPI carries ~18 MB of Python (the
framework and its test suite), under the BSD 3-Clause licence, at a stable URL with a recorded hash, so the
corpus can be rebuilt from PyPI alone, byte for byte. We only *download* it (`pip download --no-binary :all:`)
and read the `.py` files out of the archive in memory; it is never installed and none of its code is imported
or run.

Why the split holds out whole packages: files of one package (say `tests/admin_views/`) share names, imports
and idioms, so a random split of files would leak validation text into training. Validation therefore takes
whole units (`django/<pkg>/<subpkg>` or `tests/<app>`), chosen by a fixed hash of the unit's name until ~5% of
the characters are held out.

Output, in `--work DIR`: `train.jsonl` and `valid.jsonl` (one JSON object per file with `id` (its path), `work`
(its unit) and `text`), and `corpus_stats.json`.

Run: `python -m tools.default_model.corpus --work build/default_model`
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tarfile
from dataclasses import asdict, dataclass
from pathlib import Path

from .entry import run_tool

PACKAGE = "django"
VERSION = "5.2.8"
SDIST_NAME = f"{PACKAGE}-{VERSION}.tar.gz"
# sha256 of django-5.2.8.tar.gz as served by PyPI (10,849,032 bytes), recorded when this script was written.
SDIST_SHA256 = "23254866a5bb9a2cfa6004e8b809ec6246eba4b58a7589bc2772f1bcc8456c7f"
LICENCE = "BSD 3-Clause (Django Software Foundation and individual contributors)"

DEFAULT_WORK = Path("build/default_model")
DEFAULT_VALID_FRACTION = 0.05
SPLIT_SALT = "longswift-default-model-split-v2"

# Top-level folders of the archive whose .py files we read, and what we leave out and why.
SOURCE_DIRS = ("django", "tests")
EXCLUDED_PREFIXES = (
    "django/conf/locale/",  # ~100 near-identical formats.py files: repetition, not Python to learn
)
MIN_CHARS = 200  # empty __init__.py files and one-line stubs teach nothing
MAX_CHARS = 200_000  # a few generated data files; one of them would dominate a window sample


class CorpusError(RuntimeError):
    """The source archive could not be fetched, failed verification, or did not contain what we expect."""


@dataclass(frozen=True)
class Document:
    """One Python file of the archive, cleaned."""

    id: str  # path inside the archive's top folder, e.g. "django/db/models/query.py"
    work: str  # the split unit the file belongs to, e.g. "django/db/models" or "tests/admin_views"
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
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            ":all:",
            f"{PACKAGE}=={VERSION}",
            "-d",
            str(cache_dir),
        ]
        print(f"[corpus] downloading: {' '.join(command)}", flush=True)
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if result.returncode != 0 or not archive.exists():
            raise CorpusError(f"pip download of {PACKAGE}=={VERSION} failed:\n{result.stdout}\n{result.stderr}")
    verify_sdist(archive)
    return archive


def wanted(relative: str) -> bool:
    """A .py file under one of the source folders and not in an excluded one."""
    return (
        relative.endswith(".py")
        and relative.split("/", 1)[0] in SOURCE_DIRS
        and not relative.startswith(EXCLUDED_PREFIXES)
    )


def read_archive_sources(archive: Path) -> dict[str, bytes]:
    """Read every wanted `.py` file into memory, keyed by path below the archive's top folder."""
    prefix = f"{PACKAGE}-{VERSION}/"
    files: dict[str, bytes] = {}
    with tarfile.open(archive, "r:gz") as tar:
        for member in tar.getmembers():
            if member.isfile() and member.name.startswith(prefix) and wanted(member.name[len(prefix) :]):
                handle = tar.extractfile(member)
                if handle is not None:
                    files[member.name[len(prefix) :]] = handle.read()
    if not files:
        raise CorpusError(f"{archive}: no Python files under {', '.join(SOURCE_DIRS)}")
    return files


def normalise_text(raw: bytes) -> str | None:
    """Decode UTF-8 (None if the file is not UTF-8), LF line ends, no trailing spaces, no blank lines at the ends."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    return text.strip("\n") + "\n"


def work_of(path: str) -> str:
    """The split unit: `tests/<app>` for tests, `django/<pkg>/<subpkg>` (or shallower) for the framework."""
    folders = path.split("/")[:-1]
    return "/".join(folders[:2] if folders[0] == "tests" else folders[:3])


def load_documents(files: dict[str, bytes]) -> tuple[list[Document], dict[str, int]]:
    """Clean the files and drop the ones not worth training on; also return how many were dropped and why."""
    documents: list[Document] = []
    dropped = {"not_utf8": 0, "too_short": 0, "too_long": 0}
    for path in sorted(files):
        text = normalise_text(files[path])
        if text is None:
            dropped["not_utf8"] += 1
        elif len(text) < MIN_CHARS:
            dropped["too_short"] += 1
        elif len(text) > MAX_CHARS:
            dropped["too_long"] += 1
        else:
            documents.append(Document(path, work_of(path), text))
    return documents, dropped


def split_key(work: str) -> str:
    """The fixed ordering key that decides which units are held out first."""
    return hashlib.sha256(f"{SPLIT_SALT}:{work}".encode()).hexdigest()


def split_documents(documents: list[Document], valid_fraction: float) -> tuple[list[Document], list[Document]]:
    """Hold out whole units in hash order, skipping any unit that would overshoot the target share."""
    target = valid_fraction * sum(len(doc.text) for doc in documents)
    sizes: dict[str, int] = {}
    for doc in documents:
        sizes[doc.work] = sizes.get(doc.work, 0) + len(doc.text)
    held: set[str] = set()
    held_chars = 0
    for work in sorted(sizes, key=split_key):
        if held_chars + sizes[work] <= target:
            held.add(work)
            held_chars += sizes[work]
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


def corpus_stats(train: list[Document], valid: list[Document], dropped: dict[str, int], archive: Path) -> dict:
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
        "licence": LICENCE,
        "included": f"*.py under {', '.join(d + '/' for d in SOURCE_DIRS)} except {', '.join(EXCLUDED_PREFIXES)}; "
        f"{MIN_CHARS:,} to {MAX_CHARS:,} characters",
        "dropped_files": dropped,
        "split_rule": f"whole units (tests/<app>, django/<pkg>/<subpkg>) held out in sha256('{SPLIT_SALT}:<unit>') "
        "order up to the target share",
        "train": side(train),
        "valid": side(valid),
    }


def build_corpus(work_dir: Path, cache_dir: Path | None = None, valid_fraction: float = DEFAULT_VALID_FRACTION) -> dict:
    """Fetch, verify, clean and split; write train/valid JSONL and corpus_stats.json into `work_dir`."""
    work_dir.mkdir(parents=True, exist_ok=True)
    archive = fetch_sdist(cache_dir or work_dir / "cache")
    documents, dropped = load_documents(read_archive_sources(archive))
    train, valid = split_documents(documents, valid_fraction)
    write_jsonl(work_dir / "train.jsonl", train)
    write_jsonl(work_dir / "valid.jsonl", valid)
    stats = corpus_stats(train, valid, dropped, archive)
    (work_dir / "corpus_stats.json").write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    share = stats["valid"]["chars"] / (stats["valid"]["chars"] + stats["train"]["chars"])
    print(
        f"[corpus] train: {stats['train']['documents']} files, {stats['train']['chars']:,} chars; "
        f"valid: {stats['valid']['documents']} files in {len(stats['valid']['works'])} units, "
        f"{stats['valid']['chars']:,} chars ({share:.1%}); dropped {dropped}",
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
    run_tool(main, "tools.default_model.corpus")
