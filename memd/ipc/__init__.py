"""The socket side of the daemon: a Unix-socket listener and the method dispatcher."""

from memd.ipc.dispatch import Dispatcher
from memd.ipc.server import AlreadyRunning, Server, StartupError

__all__ = ["AlreadyRunning", "Dispatcher", "Server", "StartupError"]
