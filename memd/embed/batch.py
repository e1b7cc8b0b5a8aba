"""OpenAI's Batch API for a large first index or rebuild: half the price, results within 24 h.

The texts go up as a JSONL file of ``/v1/embeddings`` requests (``POST /files`` with
``purpose=batch``, then ``POST /batches``), at most 50,000 inputs a batch. Each batch is polled
every ``poll_seconds``; when it completes, its output file is downloaded (to a temporary file:
it can be large), its vectors are checked and handed to ``keep`` (the embedding cache), and only
then is the batch forgotten. Each batch memd waits for is remembered in one small JSON file in
its state directory, so a restart polls the same batch rather than paying for another. A batch
that fails, expires or is cancelled is forgotten with what it did finish kept: its other texts
are embedded through the live API instead.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from memd.atomicfile import write_atomic
from memd.embed.base import BadVectors, Vectors, check_vectors, normalize
from memd.embed.http import JsonClient
from memd.embed.usage import Usage
from memd_client.errors import MemdError

__all__ = ["BatchJob", "Batches", "BatchSource"]

logger = logging.getLogger(__name__)

MAX_INPUTS = 50_000  # the API's limit of embedding inputs in one batch
# memd's own cap on one batch's input file (the API takes 200 MB): the file is built in memory.
MAX_FILE_BYTES = 16 * 1024 * 1024
FINAL = frozenset({"completed", "failed", "expired", "cancelled"})


class BatchSource(Protocol):
    """What the Batch API needs of an embedder (memd/embed/providers.py OpenAIEmbedder)."""

    provider: str
    dims: int
    usage: Usage

    @property
    def settings_key(self) -> str: ...

    @property
    def http(self) -> JsonClient: ...

    def batch_requests(self, texts: list[str]) -> Iterator[tuple[int, list[str]]]: ...

    def batch_body(self, texts: list[str]) -> dict[str, object]: ...

    def batch_rows(self, payload: Any, n: int) -> Vectors: ...

    def count_tokens_many(self, texts: Sequence[str]) -> list[int]: ...


@dataclass
class BatchJob:
    """One batch memd waits for; ``requests`` holds the text hashes of each request line."""

    id: str
    input_file_id: str
    settings_key: str
    requests: list[list[str]]
    texts: int
    tokens: int
    submitted_at: float  # wall clock
    status: str = "validating"
    completed: int = 0
    failed: int = 0
    output_file_id: str | None = None
    error_file_id: str | None = None
    error: str | None = None

    def to_status(self, now: float) -> dict[str, Any]:
        return {
            "id": self.id,
            "status": self.status,
            "requests": len(self.requests),
            "completed": self.completed,
            "failed": self.failed,
            "texts": self.texts,
            "tokens": self.tokens,
            "age_s": round(max(0.0, now - self.submitted_at), 1),
        }


@dataclass
class _Outcome:
    """What the last finished batch gave (status shows it)."""

    id: str
    status: str
    vectors: int
    error: str | None = None
    at: float = field(default_factory=time.time)


class Batches:
    """The batches of one embedder: submit, poll, collect into ``keep``; thread-safe.

    Args:
        keep: stores vectors by text hash (the embedding cache's put).
        clock: monotonic seconds (when a batch is polled next).
    """

    def __init__(
        self,
        source: BatchSource,
        directory: Path,
        keep: Callable[[Mapping[str, Vectors]], None],
        *,
        min_tokens: int,
        poll_seconds: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self.directory = directory
        self.keep = keep
        self.min_tokens = min_tokens
        self.poll_seconds = poll_seconds
        self._clock = clock
        self._lock = threading.RLock()
        self._jobs: dict[str, BatchJob] = {}
        self._next_poll: dict[str, float] = {}
        self._pending: set[str] = set()
        self.last: _Outcome | None = None
        self._load()

    # -- what is waited for -----------------------------------------------------------------------

    def _load(self) -> None:
        if not self.directory.is_dir():
            return
        for path in sorted(self.directory.glob("batch-*.json")):
            try:
                job = BatchJob(**json.loads(path.read_bytes()))
            except (OSError, ValueError, TypeError) as exc:
                logger.warning("ignoring %s: %s", path, exc)
                continue
            if job.settings_key != self.source.settings_key:
                continue  # another model's batch: kept on disk for it
            self._add(job)
            logger.info(
                "%s: waiting for batch %s again (%s)", self.source.provider, job.id, job.status
            )

    def _add(self, job: BatchJob) -> None:
        self._jobs[job.id] = job
        self._next_poll[job.id] = 0.0
        self._pending.update(h for request in job.requests for h in request)

    def _path(self, job: BatchJob) -> Path:
        return self.directory / f"batch-{job.id}.json"

    def _save(self, job: BatchJob) -> None:
        write_atomic(self._path(job), json.dumps(asdict(job)).encode())

    def _forget(self, job: BatchJob) -> None:
        self._jobs.pop(job.id, None)
        self._next_poll.pop(job.id, None)
        self._pending = {h for j in self._jobs.values() for r in j.requests for h in r}
        with contextlib.suppress(FileNotFoundError):
            self._path(job).unlink()

    def pending(self) -> set[str]:
        """The hashes of the texts batches are still embedding (not to be sent again)."""
        with self._lock:
            return set(self._pending)

    def waiting(self) -> bool:
        with self._lock:
            return bool(self._jobs)

    def next_poll_in(self) -> float:
        """Seconds until some batch is due to be polled (0: now)."""
        with self._lock:
            if not self._next_poll:
                return self.poll_seconds
            return max(0.0, min(self._next_poll.values()) - self._clock())

    def status(self) -> dict[str, Any]:
        now = time.time()
        with self._lock:
            last = asdict(self.last) if self.last else None
            return {
                "min_tokens": self.min_tokens,
                "jobs": [j.to_status(now) for j in self._jobs.values()],
                "last": last,
            }

    # -- submitting -------------------------------------------------------------------------------

    def worth_it(self, tokens: int) -> bool:
        return tokens >= self.min_tokens

    def submit(self, items: Mapping[str, str]) -> list[BatchJob]:
        """Send ``items`` (hash -> text) as batches; return them. Raises MemdError (a
        ProviderUnavailable) when the provider refuses: the caller embeds them live instead."""
        source = self.source
        hashes = list(items)
        texts = [items[h] for h in hashes]
        jobs: list[BatchJob] = []
        lines: list[bytes] = []
        requests: list[list[str]] = []
        inputs = size = tokens = 0
        for start, group in source.batch_requests(texts):
            body = json.dumps(source.batch_body(group), ensure_ascii=False).encode()
            if lines and (inputs + len(group) > MAX_INPUTS or size + len(body) > MAX_FILE_BYTES):
                jobs.append(self._send(lines, requests, inputs, tokens))
                lines, requests, inputs, size, tokens = [], [], 0, 0, 0
            # custom_id numbers the requests of one batch: its output is matched back by it.
            head = f'{{"custom_id": "memd-{len(requests)}", "method": "POST", '
            lines.append(head.encode() + b'"url": "/v1/embeddings", "body": ' + body + b"}")
            requests.append(hashes[start : start + len(group)])
            inputs += len(group)
            size += len(lines[-1]) + 1
            tokens += sum(source.count_tokens_many(group))
        if lines:
            jobs.append(self._send(lines, requests, inputs, tokens))
        return jobs

    def _send(
        self, lines: list[bytes], requests: list[list[str]], texts: int, tokens: int
    ) -> BatchJob:
        http = self.source.http
        content = b"\n".join(lines) + b"\n"
        uploaded = http.upload("/files", {"purpose": "batch"}, "memd-embeddings.jsonl", content)
        file_id = uploaded.get("id") if isinstance(uploaded, dict) else None
        if not isinstance(file_id, str):
            raise MemdError(f"{self.source.provider}: the file upload gave no id")
        created = http.post(
            "/batches",
            {
                "input_file_id": file_id,
                "endpoint": "/v1/embeddings",
                "completion_window": "24h",
                "metadata": {"source": "memd"},
            },
        )
        batch_id = created.get("id") if isinstance(created, dict) else None
        if not isinstance(batch_id, str):
            raise MemdError(f"{self.source.provider}: the batch was created without an id")
        job = BatchJob(
            id=batch_id,
            input_file_id=file_id,
            settings_key=self.source.settings_key,
            requests=requests,
            texts=texts,
            tokens=tokens,
            submitted_at=time.time(),
            status=str(created.get("status") or "validating"),
        )
        with self._lock:
            self._save(job)
            self._add(job)
            self._next_poll[job.id] = self._clock() + self.poll_seconds
        self.source.usage.record(f"{self.source.provider} batch", texts=texts, tokens=tokens)
        logger.info(
            "%s: batch %s submitted: %d texts, about %d tokens",
            self.source.provider,
            job.id,
            texts,
            tokens,
        )
        return job

    # -- polling ----------------------------------------------------------------------------------

    def poll(self, *, force: bool = False) -> int:
        """Ask about each batch that is due (every one with ``force``); collect those that
        finished. Return how many vectors went to ``keep``."""
        with self._lock:
            now = self._clock()
            due = [j for j in self._jobs.values() if force or self._next_poll[j.id] <= now]
            for job in due:
                self._next_poll[job.id] = now + self.poll_seconds
        kept = 0
        for job in due:
            try:
                kept += self._poll_one(job)
            except MemdError as exc:  # the provider is down: asked again at the next poll
                logger.warning("%s: polling batch %s failed: %s", self.source.provider, job.id, exc)
        return kept

    def _poll_one(self, job: BatchJob) -> int:
        reply = self.source.http.get(f"/batches/{job.id}")
        if not isinstance(reply, dict):
            raise MemdError(f"{self.source.provider}: unexpected reply for batch {job.id}")
        counts = reply.get("request_counts") or {}
        with self._lock:
            job.status = str(reply.get("status") or job.status)
            job.completed = int(counts.get("completed") or 0)
            job.failed = int(counts.get("failed") or 0)
            job.output_file_id = reply.get("output_file_id") or job.output_file_id
            job.error_file_id = reply.get("error_file_id") or job.error_file_id
            errors = (reply.get("errors") or {}).get("data") or []
            if errors:
                job.error = "; ".join(str(e.get("message", e)) for e in errors[:3])
            self._save(job)
        if job.status not in FINAL:
            return 0
        kept = self._collect(job) if job.output_file_id else 0
        with self._lock:
            self.last = _Outcome(job.id, job.status, kept, job.error)
            self._forget(job)
        level = logging.INFO if job.status == "completed" else logging.WARNING
        logger.log(
            level,
            "%s: batch %s %s: %d vectors kept%s",
            self.source.provider,
            job.id,
            job.status,
            kept,
            f" ({job.error})" if job.error else "",
        )
        return kept

    def _collect(self, job: BatchJob) -> int:
        """Download the output of ``job`` and keep its vectors; return how many."""
        assert job.output_file_id is not None
        by_id = {f"memd-{n}": hashes for n, hashes in enumerate(job.requests)}
        kept = 0
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=".output-", dir=self.directory)
        try:
            with os.fdopen(fd, "w+b") as sink:
                self.source.http.download(f"/files/{job.output_file_id}/content", sink)
                sink.seek(0)
                for raw in sink:
                    kept += self._keep_line(raw, by_id)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(name)
        return kept

    def _keep_line(self, raw: bytes, by_id: Mapping[str, list[str]]) -> int:
        try:
            entry = json.loads(raw)
        except ValueError:
            return 0
        hashes = by_id.get(str(entry.get("custom_id")))
        response = entry.get("response") or {}
        if hashes is None or response.get("status_code") != 200:
            return 0  # a request that failed: its texts go through the live API
        try:
            rows = self.source.batch_rows(response.get("body"), len(hashes))
            check_vectors(rows, len(hashes), self.source.dims)
        except (MemdError, BadVectors) as exc:
            logger.warning("%s: a batch answer is unusable: %s", self.source.provider, exc)
            return 0
        vectors = normalize(rows)
        self.keep({h: vectors[i] for i, h in enumerate(hashes)})
        return len(hashes)
