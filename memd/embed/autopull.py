"""The recommended model, fetched in the background when memd would use a local model and none
is there (``[embedding] auto_pull``, on by default).

memd serves keyword search meanwhile; status shows how far the download is. When it is done
the model is chosen the way a start would choose it (loaded and probed in its worker), and
``on_ready`` puts it in service. A failed download (offline, a dropped connection, a server
error) is said in status with the routes that work without a network, and tried again later
(RETRY_SECONDS), resuming what arrived; a model put in the model directory meanwhile (`memctl
model pull FILE`) is taken instead. A model that does not load is not tried again.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memd.config import Config
from memd.embed.models import RECOMMENDED_MODEL_URI, find_default_model, pull
from memd.embed.select import Choice, choose_embedder
from memd_client.errors import MemdError

__all__ = ["ModelPull", "wanted"]

logger = logging.getLogger(__name__)

RETRY_SECONDS = (5.0, 30.0, 120.0, 600.0, 3600.0)
"""Waits before the next attempt after a failed download; the last one repeats."""
LOOK_SECONDS = 5.0
"""How often the model directory is looked at while waiting to try again."""


class _Stopped(Exception):
    """memd is stopping: the download stops where it is (the next start resumes it)."""


def wanted(config: Config, choice: Choice) -> bool:
    """Whether memd should fetch a model: it would use a local one (provider auto or local,
    no model_path), none is in the model directory, nothing else was chosen, llama-cpp-python
    is installed, and auto_pull is on."""
    emb = config.embedding
    return (
        emb.auto_pull
        and emb.provider in ("auto", "local")
        and not emb.model_path
        and choice.embedder is None
        and find_default_model(config.dirs.models) is None
        and importlib.util.find_spec("llama_cpp") is not None
    )


class ModelPull:
    """One background download of the model ``auto_pull`` fetches, then its choice."""

    def __init__(self, config: Config, on_ready: Callable[[Choice], None]) -> None:
        self.config = config
        self.uri = config.embedding.pull_uri or RECOMMENDED_MODEL_URI
        self.on_ready = on_ready
        self.state = "downloading"  # then "loading", "done", "failed" or "stopped"
        self.done = 0
        self.total: int | None = None
        self.error: str | None = None
        self.path: Path | None = None
        self.next_try: float | None = None  # when a failed download is tried again
        self.started = time.time()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memd-model-pull", daemon=True)

    def start(self) -> None:
        logger.info("no local model: downloading %s in the background", self.uri)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def busy(self) -> bool:
        return self.state in ("downloading", "loading")

    def status(self) -> dict[str, Any]:
        """What status says of it: the URI, the state, bytes done of the total, the error."""
        return {
            "uri": self.uri,
            "state": self.state,
            "done": self.done,
            "total": self.total,
            "error": self.error,
            "path": str(self.path) if self.path else None,
            "next_try": self.next_try,
        }

    def _progress(self, done: int, total: int | None) -> None:
        if self._stop.is_set():
            raise _Stopped
        self.done, self.total = done, total

    def _run(self) -> None:
        failures = 0
        models = self.config.dirs.models
        while not self._stop.is_set():
            try:
                self.path = find_default_model(models)  # put there by hand meanwhile?
                if self.path is not None:
                    break
                self.state, self.next_try = "downloading", None
                self.path = pull(self.uri, models, progress=self._progress)
                break
            except _Stopped:
                self.state = "stopped"
                return
            except Exception as exc:  # said in status; keyword search goes on
                wait = RETRY_SECONDS[min(failures, len(RETRY_SECONDS) - 1)]
                failures += 1
                self.state, self.error = "failed", str(exc) or type(exc).__name__
                self.next_try = time.time() + wait
                logger.warning("the model download failed (again in %d s): %s", wait, self.error)
                while not self._stop.wait(min(LOOK_SECONDS, wait)):
                    wait -= LOOK_SECONDS
                    if wait <= 0 or find_default_model(models) is not None:
                        break
        else:
            self.state = "stopped"
            return
        self._load()

    def _load(self) -> None:
        """Choose the downloaded model the way a start would, and put it in service."""
        assert self.path is not None
        try:
            self.state, self.error = "loading", None
            emb = self.config.embedding
            choice = choose_embedder(
                emb, models_dir=self.config.dirs.models, state_dir=self.config.state_dir, probe=True
            )
            if choice.embedder is None:
                raise MemdError(f"{self.path.name} did not load: {choice.reason}")
            if self._stop.is_set():
                choice.embedder.close()
                raise _Stopped
            self.on_ready(choice)
        except _Stopped:
            self.state = "stopped"
            return
        except Exception as exc:  # said in status; keyword search goes on
            self.state, self.error = "failed", str(exc) or type(exc).__name__
            logger.warning("the downloaded model is not in service: %s", self.error)
            return
        self.state = "done"
        logger.info("%s is in service", self.path)
