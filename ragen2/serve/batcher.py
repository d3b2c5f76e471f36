"""Many concurrent callers, one generation backend: requests are gathered into batched `generate` calls.

Agent episodes run concurrently and each waits on its own request, so generating them one by one
would leave the model at batch size 1. One worker thread owns the backend: it takes the requests
that are waiting, holds for up to `wait_s` more while fewer are waiting than `expected()` callers
are alive (the episodes still running), then generates every request with the same sampling
settings in one call. Each prompt carries its own sampling seed, so what it samples does not
depend on which other requests share its batch (HFBackend's seeded sampling).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from ragen2.agent.backends import GenerationBackend


@dataclass(frozen=True)
class Sampling:
    """The settings one `generate` call shares; requests are batched by them."""

    max_new_tokens: int
    temperature: float
    top_p: float = 1.0
    top_k: int = -1


@dataclass
class _Request:
    prompt_ids: list[int]
    sampling: Sampling
    seed: int
    future: Future = field(default_factory=Future)
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """Thread-safe front of a backend. `submit` returns a Future of the `GenerationOutput`.

    Args:
        backend: the engine; only the worker thread calls it.
        wait_s: how long the oldest request may wait for others to join its batch.
        expected: how many requests can still arrive at once (the live episodes); the batch
            goes as soon as that many wait. None waits `wait_s` every time.
        max_batch: requests per `generate` call at most.
    """

    def __init__(self, backend: GenerationBackend, wait_s: float = 0.05, expected: Callable[[], int] | None = None,
                 max_batch: int = 256):
        if wait_s < 0:
            raise ValueError(f"wait_s={wait_s} is not allowed: use a number of seconds >= 0")
        self.backend = backend
        self.wait_s = wait_s
        self.expected = expected
        self.max_batch = max_batch
        self.batch_sizes: list[int] = []  # size of every generate call made
        self.generate_s = 0.0  # time inside backend.generate
        self._pending: list[_Request] = []
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="ragen2-batcher", daemon=True)
        self._thread.start()

    def submit(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Future:
        request = _Request(list(prompt_ids), sampling, seed)
        with self._cond:
            if self._closed:
                raise RuntimeError("the batcher is closed")
            self._pending.append(request)
            self._cond.notify()
        return request.future

    def wake(self) -> None:
        """Re-check the waiting requests now (`expected()` may have dropped: an episode ended)."""
        with self._cond:
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self._thread.join()
        for request in self._pending:
            request.future.set_exception(RuntimeError("the batcher closed before this request was generated"))

    def _take(self) -> list[_Request] | None:
        """The next batch: the oldest request and every waiting one with its sampling settings."""
        with self._cond:
            while True:
                if self._closed:
                    return None
                if self._pending:
                    waited = time.monotonic() - self._pending[0].arrived
                    full = self.expected is not None and len(self._pending) >= max(1, self.expected())
                    if full or waited >= self.wait_s or len(self._pending) >= self.max_batch:
                        key = self._pending[0].sampling
                        batch = [r for r in self._pending if r.sampling == key][: self.max_batch]
                        self._pending = [r for r in self._pending if r not in batch]
                        return batch
                    self._cond.wait(self.wait_s - waited)
                else:
                    self._cond.wait()

    def _work(self) -> None:
        while (batch := self._take()) is not None:
            s = batch[0].sampling
            start = time.perf_counter()
            try:
                outputs = self.backend.generate(
                    [r.prompt_ids for r in batch], max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                    top_p=s.top_p, **({} if s.top_k == -1 else {"top_k": s.top_k}), seeds=[r.seed for r in batch],
                )
            except Exception as exc:  # the callers see the error; the worker goes on
                for r in batch:
                    r.future.set_exception(exc)
                continue
            self.generate_s += time.perf_counter() - start
            self.batch_sizes.append(len(batch))
            for r, out in zip(batch, outputs):
                r.future.set_result(out)

