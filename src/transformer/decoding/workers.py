"""Search processes: a translator's batches searched in processes of their own, one CPU
thread each, as CTranslate2's `inter_threads` searches its sub-batches.

Decoding runs many small operators: split over threads, each gains little, and Python
threads that search batches side by side wait for one another's interpreter lock, most of a
small batch's time. A process has its own. `SearchWorkers` starts `count` processes (spawned:
a fresh interpreter, never a fork of a process running torch), each loading the model as the
translator did and searching the `search.BatchJob`s it is sent with `search.search_batch`,
the same code on the same model as a search in this process; `corpus.search_corpus` deals a
request's batches to them (fewer batches than processes cut into pieces:
`batching.dealt`). Starting them costs the seconds a model takes to load, once.
"""

from __future__ import annotations

import multiprocessing
import queue
import signal
import traceback
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from .. import hardware
from ..errors import SearchProcessError
from .request import DecodingRequest
from .search import BatchJob, Hypothesis, search_batch

__all__ = ["SearchWorkers"]


@dataclass(frozen=True)
class _Failure:
    """What a search process sends back instead of a result: the error, as text (an
    exception of any type, its traceback included, without unpickling it)."""

    error: str

    @property
    def line(self) -> str:
        """The error's own line: the traceback's last."""
        return self.error.strip().splitlines()[-1]


class SearchWorkers:
    """`count` search processes, each with its own copy of a model, made by `load()` (a
    picklable callable, e.g. a `functools.partial` of `Translator.load`, returning an object
    with a `model`), searching on one CPU thread. `search(job, request)` runs a batch in an
    idle one and waits for it; several threads may call it at once (one batch each).
    `close` ends the processes (also when this object is collected, and at exit)."""

    def __init__(self, load: Callable[[], Any], count: int):
        if count < 1:
            raise ValueError(f"SearchWorkers needs at least one process, got {count}")
        context = multiprocessing.get_context("spawn")
        self.count = count
        self._processes: list[multiprocessing.process.BaseProcess] = []
        self._idle: queue.Queue[int] = queue.Queue()
        self._connections: list[Connection] = []
        self._finalizer = weakref.finalize(self, _close, self._processes, self._connections)
        for index in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs, load), daemon=True,
                                      name=f"search-{index}")
            process.start()
            theirs.close()
            self._processes.append(process)
            self._connections.append(ours)
        for index in range(count):  # each loads its model: wait for all, report the first error
            try:
                reply = self._connections[index].recv()
            except (EOFError, OSError):
                raise self._ended(index, "loading its model") from None
            if isinstance(reply, _Failure):
                self.close()
                raise SearchProcessError(f"search process {index} could not load its model: "
                                         f"{reply.line}")
            self._idle.put(index)

    def search(self, job: BatchJob, request: DecodingRequest) -> list[list[Hypothesis]]:
        """`search.search_batch(model, job, request)` in an idle search process -> each
        sentence's n-best list; waits for a process to be free, then for its result."""
        if not self._finalizer.alive:
            raise SearchProcessError("the search processes were closed (after one ended, or "
                                     "by close())")
        index = self._idle.get()
        try:
            self._connections[index].send((job, request))
            reply = self._connections[index].recv()
        except (EOFError, OSError):
            raise self._ended(index, "searching a batch") from None
        finally:
            self._idle.put(index)
        if isinstance(reply, _Failure):
            raise SearchProcessError(f"search process {index} failed: {reply.line}")
        return reply

    def close(self) -> None:
        """End the processes (each finishes the batch it is searching first)."""
        self._finalizer()

    def _ended(self, index: int, doing: str) -> SearchProcessError:
        """The error of process `index`, which ended (killed, out of memory) instead of
        replying, naming it and its exit code; the others are ended too."""
        process = self._processes[index]
        process.join(timeout=5)
        self.close()
        return SearchProcessError(f"search process {index} (pid {process.pid}) ended while "
                                  f"{doing}, exit code {process.exitcode}")


def _close(processes: list[multiprocessing.process.BaseProcess],
           connections: list[Connection]) -> None:
    """Ask each process to end (None), then end those that do not within seconds."""
    for connection in connections:
        try:
            connection.send(None)
        except (OSError, ValueError):  # it ended already
            pass
    for process, connection in zip(processes, connections, strict=True):
        process.join(timeout=10)
        if process.is_alive():
            process.kill()
            process.join()
        connection.close()


def _serve(connection: Connection, load: Callable[[], Any]) -> None:
    """A search process: load the model on one thread, say so, then search each job sent
    until None (or the parent's end) arrives. Ctrl-C is the parent's to handle: it ends
    the processes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    hardware.set_threads(1)
    try:
        model = load().model
    except BaseException:  # the parent raises it, as text
        connection.send(_Failure(traceback.format_exc()))
        return
    connection.send("ready")
    while True:
        try:
            message = connection.recv()
        except EOFError:  # the parent ended
            return
        if message is None:
            return
        job, request = message
        try:
            reply: Any = search_batch(model, job, request)
        except Exception:
            reply = _Failure(traceback.format_exc())
        try:
            connection.send(reply)
        except OSError:  # the parent ended
            return
