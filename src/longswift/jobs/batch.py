"""Batches of generation jobs: one resumable job per prompt of a JSONL file, results gathered in results.jsonl.

Each line of the prompts file is a JSON object: `prompt` (required), `id`, `max_new_tokens` and `seed` (optional).
Prompt i belongs to data-parallel group i mod G (G = processes / --tp), so groups never share a job and a rerun of
the same command gives every group the same share. A job's files in the output directory are named by its id:
  ID.txt          the generated text (synced before every checkpoint that claims it);
  ID.ckpt.json    its checkpoint (job.py): an interrupted job resumes from here, exactly;
  ID.result.json  written once the job ended (or failed): the job's line of results.jsonl, and the mark that
                  makes a rerun skip it.
A bad line (not JSON, not UTF-8, no prompt, a prompt the model cannot take) fails only its own job: the error is its
result, naming its line number.
A line whose id names the same files as an earlier line's is a bad line too (see `unique_id`); a line that is bad in
the prompts file alone owns no files, its error is reported from the file on every run.
"""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..errors import ConfigError, LongswiftError, OutputError, PromptError
from ..files import atomic_write, check_directory, check_outputs, output_problem
from ..inputs import check_seed, check_text, prompt_file_lines, undecodable
from .request import GenerationRequest
from .result import portable_stats
from .state import Cadence, JobState, TextSink, run_job

SAFE_ID = re.compile(r"[^A-Za-z0-9._-]")


@dataclass(frozen=True)
class BatchItem:
    """One line of the prompts file: a job, or the reason it cannot be one (`error`)."""

    line: int  # 1-based line number
    id: str
    prompt: str = ""
    max_new_tokens: int | None = None
    seed: int | None = None
    error: str | None = None

    @property
    def stem(self) -> str:
        """The id as a file name (characters other than letters, digits, '.', '_' and '-' become '_')."""
        return SAFE_ID.sub("_", self.id)[:120]


@dataclass(frozen=True)
class BatchOptions:
    """What every job of the batch shares: the request every job's is made from, and the checkpoint cadence.

    A job's request is `request` with the job's prompt and its resume state, and with the prompt line's own
    `max_new_tokens` and `seed` where it has them (the template's prompt is never generated).
    """

    request: GenerationRequest
    checkpoint_every: int  # tokens between a job's checkpoints
    batch_size: int = 1  # jobs decoded together in this process (batch_many.run_many); 1: one after another
    checkpoint_seconds: float = 30.0  # and at least this often (0: by tokens only)

    @property
    def cadence(self) -> Cadence:
        return Cadence(self.checkpoint_every, self.checkpoint_seconds)

    def for_item(self, item: BatchItem, resume: JobState | None) -> GenerationRequest:
        seed = item.seed if item.seed is not None else self.request.seed
        return replace(
            self.request,
            prompt=item.prompt,
            max_new_tokens=item.max_new_tokens or self.request.max_new_tokens,
            seed=seed,
            resume=resume,
        )


def read_prompts(path: Path) -> list[BatchItem]:
    """Every non-empty line of `path`, parsed; a malformed line becomes an item with its error, in its place."""
    lines = prompt_file_lines(path)
    items: list[BatchItem] = []
    owners: dict[str, int] = {}  # file-name key of an id -> the line that has it
    for number, text in enumerate(lines, start=1):
        if text.strip():
            items.append(unique_id(_parse(number, text), owners))
    if not items:
        raise PromptError(f"prompts file {path} has no prompts")
    return items


def _parse(number: int, text: str) -> BatchItem:
    fallback = f"line-{number}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        return BatchItem(number, fallback, error=f"line {number}: {undecodable(text) or f'not valid JSON ({exc.msg})'}")
    if not isinstance(data, dict):
        return BatchItem(number, fallback, error=f"line {number}: not a JSON object")
    raw_id = data.get("id", fallback)
    if not isinstance(raw_id, (str, int)) or isinstance(raw_id, bool) or not str(raw_id):
        return BatchItem(number, fallback, error=f"line {number}: id must be a non-empty string or an integer")
    item_id = str(raw_id)
    if (bad_bytes := undecodable(text)) is not None:  # reported under the line's id where the id itself is readable
        return BatchItem(number, fallback if undecodable(item_id) else item_id, error=f"line {number}: {bad_bytes}")
    try:
        check_text(item_id, "the id")
    except PromptError as exc:
        return BatchItem(number, fallback, error=f"line {number}: {exc}")
    prompt = data.get("prompt")
    if not isinstance(prompt, str) or not prompt.strip():
        return BatchItem(number, item_id, error=f"line {number}: no prompt (a non-empty string is required)")
    try:
        check_text(prompt)
        check_seed(data.get("seed") if isinstance(data.get("seed"), int) else None)
    except LongswiftError as exc:
        return BatchItem(number, item_id, error=f"line {number}: {exc}")
    n, seed = data.get("max_new_tokens"), data.get("seed")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        return BatchItem(number, item_id, error=f"line {number}: max_new_tokens must be an integer >= 1, got {n!r}")
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool)):
        return BatchItem(number, item_id, error=f"line {number}: seed must be an integer, got {seed!r}")
    return BatchItem(number, item_id, prompt, n, seed)


@dataclass
class BatchRunner:
    """Runs one group's share of a batch with a loaded engine. Every rank of a tensor-parallel group runs it the
    same way; only the lead (`writes`) touches the output directory."""

    engine: Any  # api.Engine
    out_dir: Path
    options: BatchOptions
    writes: bool
    interrupted: Callable[[], bool]
    report: Callable[[str], None]
    decide: Callable[[Callable[[], Any]], Any] = lambda make: make()  # TP: the lead decides, the group follows

    def run(self, items: list[BatchItem]) -> bool:
        """Run every job of `items` not yet finished; -> False if interrupted (rerun to resume)."""
        for item in items:
            if item.error is not None:  # known from the prompts file alone: it owns no files (its id may not)
                self.report(f"[longswift] error: {item.error}")
                continue
            if self.decide(self._result_path(item).is_file):
                continue  # finished in an earlier run: never generated twice
            try:
                if not self._run_one(item):
                    return False
            except OutputError:  # the disk is full or gone: every further job would fail alike (rerun resumes)
                raise
            except LongswiftError as exc:  # too long, a foreign checkpoint, NaN logits: this job only
                self._finish(item, {"error": str(exc)})
            except Exception as exc:  # noqa: BLE001  (a bug in longswift must not cost the other prompts theirs)
                self._finish(item, {"error": f"internal error ({type(exc).__name__}: {exc})"})
        return True

    def _run_one(self, item: BatchItem) -> bool:
        ckpt = self.out_dir / f"{item.stem}.ckpt.json"
        # A directory or device node where a job file should be is refused, never replaced (the lead decides).
        problem = self.decide(lambda: output_problem(job_files(self.out_dir, item)))
        if problem is not None:
            raise ConfigError(problem)
        resume = self.decide(lambda: JobState.load(ckpt) if ckpt.exists() else None)
        stream = self.engine.stream(self.options.for_item(item, resume))
        text = self.out_dir / f"{item.stem}.txt"
        sink = TextSink.open_file(text, resume.text if resume else None) if self.writes else TextSink(io.StringIO())
        try:
            finished = run_job(
                stream,
                sink,
                ckpt if self.writes else None,
                self.options.cadence,
                self.interrupted,
                lambda n: None,
            )
        finally:
            sink.close()
        if not finished:
            return False
        result = stream.result
        self._finish(
            item,
            {
                "output": text.name,
                "tokens": len(result.token_ids),
                "finish_reason": result.finish_reason,
                "stats": self.portable(result.stats),
            },
        )
        return True

    def portable(self, stats: dict[str, Any]) -> dict[str, Any]:
        """`stats` as results.jsonl keeps them (`portable_stats`: no absolute path to the heads)."""
        return portable_stats(stats, self.engine.checkpoint.path)

    def finish(self, item: BatchItem, fields: dict[str, Any]) -> None:
        """Write `item`'s result (its line of results.jsonl) and report it."""
        self._finish(item, fields)

    def result_path(self, item: BatchItem) -> Path:
        return self._result_path(item)

    def _finish(self, item: BatchItem, fields: dict[str, Any]) -> None:
        line = {"id": item.id, "line": item.line, **fields}
        path = self._result_path(item)
        if self.writes:
            if path.is_file() or not path.exists():  # else: reported, and the path left alone
                atomic_write(path, json.dumps(line).encode("utf-8"))
            what = (
                f"error: {fields['error']}"
                if "error" in fields
                else f"{fields['tokens']} tokens, {fields['finish_reason']}"
            )
            self.report(f"[longswift] {item.id}: {what}")

    def _result_path(self, item: BatchItem) -> Path:
        return self.out_dir / f"{item.stem}.result.json"


def share(items: list[BatchItem], group: int, groups: int) -> list[BatchItem]:
    """The jobs of data-parallel group `group` of `groups`: every groups-th prompt (disjoint, stable on rerun)."""
    return items[group::groups]


def results_lines(items: list[BatchItem], out_dir: Path) -> list[dict[str, Any]]:
    """results.jsonl's lines, in the prompts file's order (a job without a result is reported as unfinished)."""
    lines = []
    for item in items:
        if item.error is not None:
            lines.append({"id": item.id, "line": item.line, "error": item.error})
            continue
        path = out_dir / f"{item.stem}.result.json"
        try:
            lines.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            lines.append({"id": item.id, "line": item.line, "error": "not finished (rerun the same command)"})
    return lines


def write_results(path: Path, lines: list[dict[str, Any]]) -> None:
    atomic_write(path, "".join(json.dumps(line) + "\n" for line in lines).encode("utf-8"))


def check_out_dir(out_dir: Path, prompts: Path | None = None) -> None:
    """Before any work: the output directory can be written, and results.jsonl is not the prompts file."""
    check_directory(out_dir, "--out-dir")
    check_outputs({"results.jsonl": out_dir / "results.jsonl"}, {"--prompts": prompts})


# Job ids of a batch: unique by the files they name, so no job can overwrite another's text, checkpoint or result.
# An id becomes file names (`BatchItem.stem`: characters outside [A-Za-z0-9._-] become '_', cut at 120), and
# file systems may ignore case, so two ids clash when their stems are equal ignoring case ("a b" and "A_B"), and
# an explicit id can take a later line's default id ("line-2" on line 1). The first line keeps the id; every later
# line that claims it is an error of its own, and an error line owns no files (it is reported from the prompts
# file alone), so a collision can never make two prompts share a result.
JOB_SUFFIXES = {"text": ".txt", "checkpoint": ".ckpt.json", "result": ".result.json"}


def id_key(item: BatchItem) -> str:
    """What two ids must not share: their file stem, ignoring case."""
    return item.stem.lower()


def unique_id(item: BatchItem, owners: dict[str, int]) -> BatchItem:
    """`item`, or an error item if an earlier line already has its id; records the id in `owners`."""
    if item.error is not None:
        return item
    key = id_key(item)
    if key in owners:
        return replace(
            item,
            error=f"line {item.line}: id {item.id!r} names the same files as the id "
            f"of line {owners[key]} (ids must differ in more than case and "
            "characters outside A-Z a-z 0-9 . _ -); give it another id",
        )
    owners[key] = item.line
    return item


def job_files(out_dir: Path, item: BatchItem) -> dict[str, Path]:
    """The files of `item`'s job in the output directory, by role."""
    return {f"{item.id!r} {role}": out_dir / f"{item.stem}{suffix}" for role, suffix in JOB_SUFFIXES.items()}
