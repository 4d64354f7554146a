"""Each dataset's ``fit`` and ``predict`` on a thread of its own, its model forwards answered
from batched forwards that the calling thread runs over every dataset's pending call.

A dataset's estimator copy runs a :func:`.padding.shadow` of the model whose forward *posts*
the call (its inputs, as tabpfn made them) and waits for the answer; ``predict`` then goes on
with that answer and decodes it, so every dataset is preprocessed once. The caller collects
the posted calls in rounds (:meth:`Rendezvous.rounds`: a round is ready when no dataset is
working, each one waiting on a forward or finished), runs the forwards and hands each call
its slice (:meth:`Rendezvous.answer`). At most ``n_jobs`` datasets work at once; a dataset
waiting on a forward holds no worker. Nothing is set on the shared model, so other threads
using it (a copy of the estimator predicting) see nothing of a batched call.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Callable, Iterator

from torch import Tensor

from .padding import RecordedCall

__all__ = ["Aborted", "Posted", "Rendezvous"]


class Aborted(Exception):
    """Raised in a dataset's thread when the batched call gave up (another dataset failed)."""


@dataclasses.dataclass
class Posted:
    """One posted model call awaiting its output."""

    call: RecordedCall
    output: Tensor | None = None
    aborted: bool = False
    ready: threading.Event = dataclasses.field(default_factory=threading.Event)


class Rendezvous:
    """The datasets' threads and the rounds of model calls they post (see the module doc)."""

    def __init__(self, n_datasets: int, n_jobs: int) -> None:
        self._changed = threading.Condition()
        self._working = n_datasets            # datasets neither waiting on a forward nor done
        self._posted: list[Posted] = []           # posted since the last round
        self._unanswered: list[Posted] = []       # posted, not yet answered
        self._workers = threading.Semaphore(n_jobs)
        self._aborted = False
        self._threads: list[threading.Thread] = []
        self.results: list[Any] = [None] * n_datasets
        self.errors: dict[int, BaseException] = {}

    def forward(self, dataset: int, check: Callable[..., RecordedCall]
                ) -> Callable[..., Tensor]:
        """The forward of dataset ``dataset``'s model: ``check`` turns the call's arguments
        into a :class:`RecordedCall` (or refuses them); the call is posted and its output
        awaited."""
        def post(*args: Any, **kwargs: Any) -> Tensor:
            posted = Posted(check(dataset, *args, **kwargs))
            with self._changed:
                if self._aborted:
                    raise Aborted
                self._posted.append(posted)
                self._unanswered.append(posted)
                self._working -= 1
                self._changed.notify_all()
            self._workers.release()
            try:
                posted.ready.wait()
            finally:
                self._workers.acquire()
            if posted.aborted:
                raise Aborted
            assert posted.output is not None
            return posted.output
        return post

    def start(self, dataset: int, job: Callable[[], Any]) -> None:
        """Run ``job`` (the dataset's fit and predict) on a thread of its own; its result or
        its error is kept under ``dataset``."""
        def run() -> None:
            self._workers.acquire()
            try:
                self.results[dataset] = job()
            except Aborted:
                pass
            except BaseException as exc:              # handed to the caller by number
                self.errors[dataset] = exc
            finally:
                self._workers.release()
                with self._changed:
                    self._working -= 1
                    self._changed.notify_all()

        thread = threading.Thread(target=run, name=f"predict_batched dataset {dataset}",
                                  daemon=True)
        self._threads.append(thread)
        thread.start()

    def rounds(self) -> Iterator[list[Posted]]:
        """The calls posted while every dataset waits on a forward or is done; ends when all
        are done or one failed (its error is in ``errors``)."""
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._working == 0)
                posted, self._posted = self._posted, []
            if not posted or self.errors:
                self.abort()
                return
            yield posted

    def answer(self, posted: list[Posted], outputs: list[Tensor]) -> None:
        """Hand each posted call its output and let its dataset work on."""
        with self._changed:
            self._working += len(posted)
            answered = set(map(id, posted))
            self._unanswered = [p for p in self._unanswered if id(p) not in answered]
        for item, output in zip(posted, outputs, strict=True):
            item.output = output
            item.ready.set()

    def abort(self) -> None:
        """Release every waiting dataset without an answer and wait for the threads to end."""
        with self._changed:
            self._aborted = True
            posted, self._posted, self._unanswered = self._unanswered, [], []
        for item in posted:
            item.aborted = True
            item.ready.set()
        for thread in self._threads:
            thread.join()
