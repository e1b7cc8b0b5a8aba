"""What a running memd is made of (:class:`Parts`), and :func:`build`, the one place that
makes them: stores, writer, recall recorder, dreaming schedule, watchers, then the socket.

Its own module: the wiring, read (and changed) in one place, apart from the lifecycle that
starts, runs and stops it (memd/daemon/__init__.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memd.clock import Clock
from memd.config import Config
from memd.dreams.recorder import RecallRecorder
from memd.dreams.schedule import Schedule
from memd.embed.select import Choice
from memd.ipc import Dispatcher, Server
from memd.ipc.context import Context
from memd.ipc.methods import Methods
from memd.once import APPEND_KEY_SECONDS, APPEND_KEYS_KEPT, AppendKeys
from memd.readers import ReaderPool
from memd.registry import Workspaces, load_registry
from memd.service import MemoryService
from memd.watch import Watchers
from memd.writer.jobs import RECONCILE, WATCH
from memd.writer.writer import Writer

__all__ = ["Parts", "build"]


@dataclasses.dataclass
class Parts:
    """Everything a running daemon is made of, built once by :func:`build`."""

    service: MemoryService
    writer: Writer
    recorder: RecallRecorder
    schedule: Schedule | None
    watchers: Watchers
    methods: Methods
    dispatcher: Dispatcher
    server: Server
    _stack: contextlib.ExitStack

    @property
    def registry(self) -> Workspaces:
        return self.service.registry

    @property
    def ctx(self) -> Context:
        return self.methods.ctx

    def close(self) -> None:
        """Stop in the reverse order of start: the socket first, the stores and model last."""
        self._stack.close()


def build(
    config: Config,
    *,
    choice: Choice | None,
    socket_path: Path,
    watchers: Watchers,
    on_count: Callable[[int], None],
    clock: Clock,
    listening: socket.socket | None = None,
    started: dict[str, Any] | None = None,
) -> Parts:
    """Wire and start every part: stores, writer, recall recorder, watchers, then the socket
    (last, so no request arrives before the rest is up). Whatever started is stopped again if a
    later part fails."""
    with contextlib.ExitStack() as stack:
        service = MemoryService(config, choice=choice)
        stack.callback(service.close)
        service.readers = ReaderPool(config.search.reader_processes)
        writer = Writer(service.registry, clock=clock)
        writer.start()
        stack.callback(writer.stop)
        recorder = RecallRecorder(clock=clock)
        recorder.start()
        stack.callback(recorder.stop)
        schedule = None
        if config.dreaming.enabled:
            schedule = Schedule(
                config.dreaming.schedule, state_path=config.state_dir / "dreaming.json", clock=clock
            )
        stack.callback(watchers.stop)
        registry_file = config.state_dir / "workspaces.json"
        service.registry.attach(
            watchers=watchers,
            changes=writer.changes_of,
            sync=lambda ws, keys, reconcile: writer.request_sync(
                ws, keys, priority=RECONCILE if reconcile else WATCH
            ),
            registry_file=registry_file,
        )
        service.registry.open_all(load_registry(registry_file))
        keys = AppendKeys(
            config.state_dir / "append-keys.jsonl",
            kept=APPEND_KEYS_KEPT,
            seconds=APPEND_KEY_SECONDS,
        )
        stack.callback(keys.close)
        ctx = Context(
            service,
            writer,
            watchers,
            clock=clock,
            registry_file=registry_file,
            recorder=recorder,
            schedule=schedule,
            append_keys=keys,
            socket_path=str(socket_path),
            started=started or {},  # before the first client can ask
        )
        methods = Methods(ctx)
        dispatcher = Dispatcher(methods)
        server = Server(socket_path, dispatcher, on_count=on_count, listening=listening)
        stack.callback(server.stop)
        server.bind()
        server.start()
        parts = Parts(
            service,
            writer,
            recorder,
            schedule,
            watchers,
            methods,
            dispatcher,
            server,
            stack.pop_all(),
        )
    return parts
