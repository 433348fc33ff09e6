"""Batch transcription of a corpus with Ray Data.

The job: list the inputs (files, directories, globs, or manifests), skip those whose outputs already
exist (a killed job resumes where it stopped), decode each remaining file to 16 kHz mono in a Ray task,
and run an actor pool of engines over the decoded audio with ``map_batches``.  Each worker builds one
engine (one torch thread by default), decodes its batch with the engine's own cross-request batching,
and writes each file's outputs atomically (a temporary file renamed into place), so a file either has
all its outputs or none.  A worker that dies is restarted and its batch retried by Ray Data; a retried
file rewrites the same content, so nothing is lost or duplicated.

Resources: a worker reserves ``worker_cpus`` (0.9) of a logical CPU and a decode task ``decode_cpus``
(0.1), so N workers and their audio decoding fit a cluster of N CPUs.
"""

from __future__ import annotations

import json
import math
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from oasr.ray.requirement import require_ray

#: audio is decoded to this rate in the Ray tasks; the engine resamples if its model wants another
DECODE_RATE = 16000
#: inputs with these suffixes are manifests: one audio path per line (``.txt``, ``.list``) or JSON
#: lines with an ``audio`` (or ``path``) field (``.jsonl``); relative paths are relative to the manifest
MANIFEST_SUFFIXES = (".txt", ".list", ".jsonl")

#: (engine, decoding options, render) where ``render(output)`` gives one text per output format
WorkerParts = tuple[Any, Any, Callable[[Any], list[str]]]


@attrs.frozen
class FileTiming:
    """When and where one file was transcribed (wall-clock ``time.time()`` seconds of the worker's host).

    ``loading`` and ``ready``: the start and end of the worker's engine build (its process already
    running, Ray Data imported); ``started`` and ``finished``: its batch's (the files of a batch are
    transcribed together, so they share them); ``seconds``: the file's audio duration.
    """

    worker: str
    loading: float
    ready: float
    started: float
    finished: float
    seconds: float


_TIMES = ("loading", "ready", "started", "finished", "seconds")


@attrs.define
class DatasetSummary:
    """What a job did: files transcribed now, files skipped as already finished, and failures;
    ``timings`` holds a :class:`FileTiming` for each file a worker reported (its last try)."""

    transcribed: list[str] = attrs.field(factory=list)
    skipped: list[str] = attrs.field(factory=list)
    failed: dict[str, str] = attrs.field(factory=dict)
    timings: dict[str, FileTiming] = attrs.field(factory=dict)

    @property
    def ok(self) -> bool:
        return not self.failed


def read_manifest(path: Path) -> list[tuple[Path, Path]]:
    """(audio file, output-relative path) for each entry of a manifest."""
    from oasr.errors import ConfigError

    entries = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if path.suffix == ".jsonl":
            try:
                record = json.loads(line)
                line = record.get("audio") or record["path"]
            except (json.JSONDecodeError, KeyError, AttributeError):
                raise ConfigError(f"{path}:{number}: expected a JSON object with an 'audio' field, got {line[:80]!r}",
                                  key="manifest") from None
        audio = Path(line) if Path(line).is_absolute() else path.parent / line
        if not audio.is_file():
            raise ConfigError(f"{path}:{number}: {audio} is not a file", key="manifest")
        rel = audio.relative_to(path.parent) if audio.is_relative_to(path.parent) else Path(audio.name)
        entries.append((audio, rel))
    return entries


def list_inputs(inputs: Sequence[str | os.PathLike]) -> list[tuple[Path, Path]]:
    """(file, path relative to its input root): files, directories, globs (as ``oasr transcribe``) and manifests."""
    from oasr.transcribe import expand_inputs

    out: list[tuple[Path, Path]] = []
    for item in inputs:
        path = Path(item)
        if path.is_file() and path.suffix.lower() in MANIFEST_SUFFIXES:
            out.extend(read_manifest(path))
        else:
            out.extend(expand_inputs([str(item)]))
    seen: set[Path] = set()
    return [(p, rel) for p, rel in out if not (p.resolve() in seen or seen.add(p.resolve()))]


def output_paths(output_dir: Path, files: list[tuple[Path, Path]], formats: Sequence[str]) -> list[list[Path]]:
    """The files each input writes: the input tree mirrored under ``output_dir``, one file per format,
    exactly as the in-process ``oasr transcribe -o DIR`` lays them out."""
    from oasr.transcribe import destinations

    return destinations(str(output_dir), files, tuple(formats), True)


def _write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_name(f".{path.name}.{uuid.uuid4().hex}.part")
    part.write_text(text, encoding="utf-8")
    os.replace(part, path)


def _decode(row: dict[str, Any], *, max_seconds: float | None) -> dict[str, Any]:
    """A Ray task: one file → 16 kHz mono float32 samples (or the decoding error)."""
    from oasr.audio import load
    from oasr.errors import OasrError

    try:
        samples = load(row["path"], DECODE_RATE, max_seconds=max_seconds)
        return {**row, "samples": samples, "error": ""}
    except OasrError as exc:
        return {**row, "samples": np.zeros(0, dtype=np.float32), "error": str(exc)}


class _Transcriber:
    """An actor of the pool: one engine, fed one batch of decoded files at a time."""

    def __init__(self, factory: Callable[[], WorkerParts]):
        self.loading = time.time()
        self.engine, self.decoding, self.render = factory()
        self.ready = time.time()
        self.worker = f"{socket.gethostname()}:{os.getpid()}"

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, Any]:
        started = time.time()
        paths = [str(p) for p in batch["path"]]
        errors = [str(e) for e in batch["error"]]
        dests = [json.loads(str(d)) for d in batch["dests"]]
        todo = [i for i, e in enumerate(errors) if not e]
        if todo:
            outputs = self.engine.transcribe_outputs([np.asarray(batch["samples"][i], dtype=np.float32) for i in todo],
                                                     sample_rate=DECODE_RATE, decoding=self.decoding)
            for i, output in zip(todo, outputs, strict=True):
                if output.finish_reason == "error":
                    errors[i] = output.error or "failed"
                    continue
                for dest, text in zip(dests[i], self.render(output), strict=True):
                    _write_atomically(Path(dest), text)
        n = len(paths)
        return {"path": paths, "error": errors, "worker": [self.worker] * n, "loading": [self.loading] * n,
                "ready": [self.ready] * n, "started": [started] * n, "finished": [time.time()] * n,
                "seconds": [np.asarray(s).size / DECODE_RATE for s in batch["samples"]]}


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def engine_factory(config: Any, decoding: Any, formats: Sequence[str]) -> Callable[[], WorkerParts]:
    """A worker factory for the Python API: an engine of ``config``, requests with ``decoding``."""

    def build() -> WorkerParts:
        from oasr.engine import DecodingOptions, Engine
        from oasr.engine.formats import render

        engine = Engine(config)
        options = decoding or DecodingOptions()
        return engine, options, lambda out: [render(out, fmt, task=options.task) for fmt in formats]

    return build


def _pipeline(ray: Any, rows: list[dict[str, str]], factory: Callable[[], WorkerParts], *, workers: int,
              batch_size: int, max_seconds: float | None, worker_cpus: float, decode_cpus: float) -> Any:
    """The Ray Data pipeline of a job: its rows in blocks, decoded in Ray tasks, transcribed by the actor pool."""
    ray.data.DataContext.get_current().enable_progress_bars = False
    n = max(1, workers)
    # longest first (file size stands in for duration), in blocks of about one batch: the workers finish
    # together instead of one of them decoding a last block of long files while the others idle
    rows.sort(key=lambda row: _size(row["path"]), reverse=True)
    # at least four batches per worker: Ray Data hands a worker up to two batches at once, so a small job in
    # full-size batches would leave the workers that became ready last with nothing to do
    batch_size = max(1, min(batch_size, math.ceil(len(rows) / (4 * n))))
    blocks = max(min(len(rows), n * 4), min(math.ceil(len(rows) / batch_size), n * 32))
    ds = ray.data.from_items(rows, override_num_blocks=blocks)
    # at most one decode task per worker at a time: a file decodes in a few percent of its transcription
    # time, and each concurrent task is a Ray worker process to start, competing with the engines' start-up
    # for the cores (older Ray releases export no TaskPoolStrategy and take the cap as ``concurrency``)
    pool = {"compute": ray.data.TaskPoolStrategy(size=n)} if hasattr(ray.data, "TaskPoolStrategy") else {
        "concurrency": n}
    ds = ds.map(_decode, fn_kwargs={"max_seconds": max_seconds}, num_cpus=decode_cpus, **pool)
    ds = ds.map_batches(_Transcriber, fn_constructor_kwargs={"factory": factory}, batch_size=batch_size,
                        batch_format="numpy", num_cpus=worker_cpus, compute=ray.data.ActorPoolStrategy(size=workers))
    return ds


def run_job(files: list[tuple[Path, Path]], dests: list[list[Path]], factory: Callable[[], WorkerParts], *,
            workers: int = 2, batch_size: int = 8, max_seconds: float | None = None, progress: bool = True,
            worker_cpus: float = 0.9, decode_cpus: float = 0.1, ray_address: str | None = None) -> DatasetSummary:
    """Transcribe ``files`` into ``dests`` (one list of paths per file) on Ray; see the module docstring."""
    ray = require_ray("data")
    from tqdm import tqdm

    summary = DatasetSummary()
    rows = []
    for (path, _rel), targets in zip(files, dests, strict=True):
        if all(t.is_file() for t in targets):
            summary.skipped.append(str(path))
        else:
            rows.append({"path": str(path), "dests": json.dumps([str(t) for t in targets])})
    if not rows:
        return summary
    if not ray.is_initialized():
        ray.init(address=ray_address, include_dashboard=False, log_to_driver=False,
                 **({} if ray_address else {"num_cpus": max(workers, os.cpu_count() or 1)}))
    ds = _pipeline(ray, rows, factory, workers=workers, batch_size=batch_size, max_seconds=max_seconds,
                   worker_cpus=worker_cpus, decode_cpus=decode_cpus)
    done: dict[str, str] = {}
    with tqdm(total=len(rows), unit="file", disable=not progress) as bar:
        for row in ds.iter_rows():
            path = str(row["path"])
            if path not in done:  # a retried batch reports its files again
                bar.update(1)
            done[path] = str(row["error"])
            summary.timings[path] = FileTiming(str(row["worker"]), *(float(row[k]) for k in _TIMES))
    for row in rows:
        error = done.get(row["path"], "no result (the job ended early)")
        if error:
            summary.failed[row["path"]] = error
        else:
            summary.transcribed.append(row["path"])
    return summary


def transcribe_dataset(inputs: Sequence[str | os.PathLike], output_dir: str | os.PathLike, *, model: str | None = None,
                       config: Any = None, decoding: Any = None, formats: Sequence[str] = ("text",),
                       workers: int = 2, batch_size: int = 8, threads_per_worker: int = 1, progress: bool = True,
                       ray_address: str | None = None) -> DatasetSummary:
    """Transcribe every input (files, directories, globs, manifests) into ``output_dir`` on Ray Data.

    ``config`` (an :class:`~oasr.engine.EngineConfig`; default: ``model`` with ``threads_per_worker``
    torch threads) is built once per worker; ``decoding`` (:class:`~oasr.engine.DecodingOptions`)
    applies to every file; ``formats`` are ``oasr transcribe``'s (``text``, ``json``, ``verbose_json``,
    ``srt``, ``vtt``, ``txt``, ``tsv``).  Files whose outputs all exist are skipped (resume).
    """
    from oasr.engine import EngineConfig

    config = config or EngineConfig(model=model, num_threads=threads_per_worker)
    files = list_inputs(inputs)
    dests = output_paths(Path(output_dir), files, formats)
    return run_job(files, dests, engine_factory(config, decoding, formats), workers=workers, batch_size=batch_size,
                   max_seconds=config.max_audio_seconds, progress=progress, ray_address=ray_address)


def _cli_factory(args: Any, formats: Sequence[str]) -> Callable[[], WorkerParts]:
    """A worker factory for ``oasr transcribe --ray``: the in-process CLI's engine, options and writers."""

    def build() -> WorkerParts:
        from oasr.engine.formats import render
        from oasr.transcribe import build_engine, subtitle_layout

        engine, decoding = build_engine(args)
        layout = subtitle_layout(args)
        return engine, decoding, lambda out: [render(out, fmt, task=decoding.task, layout=layout) for fmt in formats]

    return build


def run_cli(args: Any, formats: Sequence[str]) -> int:
    """``oasr transcribe --ray``: the same outputs as the in-process command, on ``--workers`` engines."""
    import sys
    from argparse import Namespace

    files = list_inputs(args.audio)
    if not files:
        print("oasr: error: no audio files found", file=sys.stderr)
        return 2
    worker_args = Namespace(**vars(args))
    if worker_args.num_threads is None:
        worker_args.num_threads = 1  # one torch thread per worker: the workers are the parallelism
    summary = run_job(files, output_paths(Path(args.output), files, formats), _cli_factory(worker_args, formats),
                      workers=args.workers, batch_size=args.max_batch_size, progress=not args.no_progress,
                      ray_address=args.ray_address)
    if summary.skipped:
        print(f"oasr: {len(summary.skipped)} file(s) already finished, skipped", file=sys.stderr)
    for path, error in summary.failed.items():
        print(f"oasr: error: {path}: {error}", file=sys.stderr)
    if summary.failed:
        print(f"oasr: {len(summary.failed)} of {len(files)} file(s) failed", file=sys.stderr)
    return 1 if summary.failed else 0
