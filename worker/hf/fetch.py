"""`tandem fetch-model`: download the files a pod needs from a Hugging Face repository into a folder that
pods may share (a node-local host path or a ReadWriteMany claim), once.

Concurrent fetches into one folder take a file lock: the first downloads, the others wait and then find the
files there. A marker written last (atomically, after every file's size is checked against the Hub's
listing) is what says a part is complete, so a download cut short never looks like a cached model. The
outcome (cache hit or miss, bytes, seconds, the model's max_position_embeddings) goes to the container's
termination message, where the operator reads it for the `ModelCached` condition, the cold-start figures and
the model's own context limit.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import logging
import os
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tandem.worker.hf.files import WEIGHTS_INDEX, NoWeights, Part, needs_index, select

log = logging.getLogger("tandem.fetch")
MARKER = ".tandem-fetch.json"
LOCK = ".tandem-fetch.lock"
TERMINATION_LOG = "/dev/termination-log"
PARALLEL_FILES = 4


@dataclass(frozen=True)
class Outcome:
    """What one fetch did; the operator parses this JSON from the termination message."""

    cache: str  # "hit": every file was there; "miss": this fetch downloaded
    files: int
    bytes: int  # downloaded by this fetch (0 on a hit)
    seconds: float  # the whole fetch, the wait for the lock included
    waited_seconds: float  # waiting for another pod's download
    commit: str
    max_position_embeddings: int | None = None  # the model's own context limit, from its config.json


def read_marker(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def complete(folder: Path, part: Part, commit: str | None = None) -> bool:
    """The marker says `part` (of `commit`, when given) is here, and every file it lists has its size."""
    marker = read_marker(folder)
    if commit is not None and marker.get("commit") != commit:
        return False
    parts = marker.get("parts") or {}
    # a folder with the weights has the config and the tokenizer too
    sizes = parts.get(part.value) or (parts.get(Part.weights.value) if part == Part.tokenizer else None)
    if not sizes:
        return False
    return all(_size(folder / name) == size for name, size in sizes.items())


def _size(path: Path) -> int | None:
    try:
        return path.stat().st_size
    except OSError:
        return None


def _write_marker(folder: Path, repo_id: str, commit: str, part: Part, sizes: dict[str, int]) -> None:
    marker = read_marker(folder) if read_marker(folder).get("commit") == commit else {}
    parts = {**(marker.get("parts") or {}), part.value: sizes}
    tmp = folder / f"{MARKER}.{os.getpid()}.tmp"
    tmp.write_text(json.dumps({"repo": repo_id, "commit": commit, "parts": parts}, sort_keys=True))
    os.replace(tmp, folder / MARKER)  # atomic: a reader sees the old marker or the whole new one


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[float]:
    """Hold the folder's fetch lock (released by the kernel if this process dies); yields seconds waited."""
    started = time.monotonic()
    with open(folder / LOCK, "a+b") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log.info("another pod is downloading into %s; waiting for it", folder)
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield time.monotonic() - started
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _listing(
    repo_id: str, revision: str, endpoint: str | None, token: str | None
) -> tuple[str, dict[str, int]]:
    """(commit, file -> size) of a revision, in one request to the Hub's API."""
    from huggingface_hub import HfApi

    info = HfApi(endpoint=endpoint, token=token).model_info(repo_id, revision=revision, files_metadata=True)
    if not info.sha:
        raise RuntimeError(f"the Hub gave no commit for {repo_id}@{revision}")
    return info.sha, {s.rfilename: int(s.size or 0) for s in info.siblings or []}


def _download(
    repo_id: str, commit: str, name: str, folder: Path, endpoint: str | None, token: str | None
) -> None:
    from huggingface_hub import hf_hub_download

    hf_hub_download(repo_id, name, revision=commit, local_dir=folder, endpoint=endpoint, token=token)


def fetch(
    repo_id: str,
    revision: str,
    folder: Path,
    part: Part,
    endpoint: str | None = None,
    token: str | None = None,
) -> Outcome:
    """Make `folder` hold `part` of the repository at `revision`; download only what is not there yet.

    Raises NoWeights (the repository has nothing the loader reads) or the client's error (network, auth);
    either way the marker is not written, so the next fetch starts over (resuming what is half there).
    """
    started = time.monotonic()
    folder.mkdir(parents=True, exist_ok=True)
    with locked(folder) as waited:
        marker = read_marker(folder)
        pinned = marker.get("commit") if marker.get("commit") == revision else None
        if pinned and complete(folder, part, pinned):  # a commit never changes: no request at all
            return _outcome("hit", folder, part, started, waited, pinned, 0)
        try:
            commit, sizes = _listing(repo_id, revision, endpoint, token)
        except Exception as e:
            cached = marker.get("commit")
            if cached and complete(folder, part, cached):
                log.warning("the Hub did not answer (%s); using the cached commit %s", e, cached)
                return _outcome("hit", folder, part, started, waited, cached, 0)
            raise
        if complete(folder, part, commit):
            return _outcome("hit", folder, part, started, waited, commit, 0)
        index, fetched = None, 0
        if part == Part.weights and needs_index(sizes):
            _download(repo_id, commit, WEIGHTS_INDEX, folder, endpoint, token)  # it names the shards
            index, fetched = (folder / WEIGHTS_INDEX).read_text(), sizes[WEIGHTS_INDEX]
        wanted = select(sizes, part, index)
        moved = bool(marker.get("commit")) and marker.get("commit") != commit  # the client compares each etag
        todo = [f for f in wanted if moved or _size(folder / f) != sizes[f]]
        total = sum(sizes[f] for f in todo)
        for f in todo:  # a damaged file under its final name: the client would trust its own metadata
            if _size(folder / f) not in (None, sizes[f]):
                (folder / f).unlink()
        log.info(
            "downloading %d of %d files (%.1f MiB) of %s@%s",
            len(todo),
            len(wanted),
            total / 2**20,
            repo_id,
            commit[:12],
        )
        done = 0
        with ThreadPoolExecutor(max_workers=PARALLEL_FILES, thread_name_prefix="fetch") as pool:
            futures = {pool.submit(_download, repo_id, commit, f, folder, endpoint, token): f for f in todo}
            for fut, name in futures.items():
                fut.result()
                done += sizes[name]
                log.info("%s done; %.1f of %.1f MiB", name, done / 2**20, total / 2**20)
        got = {f: _size(folder / f) for f in wanted}
        wrong = {f: n for f, n in got.items() if n != sizes[f]}
        if wrong:
            for f in wrong:
                (folder / f).unlink(missing_ok=True)
            raise RuntimeError(
                f"sizes differ from the Hub's listing, removed to fetch again: {sorted(wrong)}"
            )
        _write_marker(folder, repo_id, commit, part, {f: sizes[f] for f in wanted})
        return _outcome(
            "miss" if todo or fetched else "hit", folder, part, started, waited, commit, total + fetched
        )


def _outcome(
    cache: str, folder: Path, part: Part, started: float, waited: float, commit: str, downloaded: int
) -> Outcome:
    parts = read_marker(folder).get("parts") or {}
    files = parts.get(part.value) or parts.get(Part.weights.value) or {}
    return Outcome(
        cache,
        len(files),
        downloaded,
        round(time.monotonic() - started, 3),
        round(waited, 3),
        commit,
        _positions(folder),
    )


def _positions(folder: Path) -> int | None:
    """config.json's max_position_embeddings (None when absent or unreadable): the operator holds the spec's
    maxContextLength to it."""
    try:
        value = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
    except (OSError, ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and value > 0 else None


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="tandem fetch-model", description=__doc__.splitlines()[0])
    p.add_argument("repo_id", help="a Hugging Face model repository, e.g. meta-llama/Llama-3.1-8B-Instruct")
    p.add_argument(
        "--revision", default="main", help="branch, tag or commit (a commit makes a cache hit offline)"
    )
    p.add_argument(
        "--dir", required=True, type=Path, help="the folder to fill (shared by the pods of a node)"
    )
    p.add_argument(
        "--part",
        choices=[p.value for p in Part],
        default=Part.weights.value,
        help="weights: weights, config and tokenizer (workers); tokenizer: config and tokenizer (routers)",
    )
    p.add_argument(
        "--report",
        default=TERMINATION_LOG,
        help="write the outcome (JSON) here when the folder exists (the container's termination message)",
    )
    return p.parse_args(argv)


def _report(path: str, body: dict[str, Any]) -> None:
    if path and Path(path).parent.is_dir():
        with contextlib.suppress(OSError):
            Path(path).write_text(json.dumps(body, sort_keys=True))


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s fetch-model %(levelname)s %(message)s")
    endpoint, token = os.environ.get("HF_ENDPOINT") or None, os.environ.get("HF_TOKEN") or None
    try:
        out = fetch(args.repo_id, args.revision, args.dir, Part(args.part), endpoint, token)
    except NoWeights as e:
        _report(args.report, {"error": str(e)})
        print(f"tandem fetch-model: {args.repo_id}: {e}", file=sys.stderr)
        return 2
    except Exception as e:  # network, auth, disk: the kubelet restarts the init container, which resumes
        _report(args.report, {"error": f"{type(e).__name__}: {e}"[:1000]})
        print(f"tandem fetch-model: {args.repo_id}@{args.revision}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    _report(args.report, asdict(out))
    print(json.dumps(asdict(out), sort_keys=True), flush=True)
    return 0
