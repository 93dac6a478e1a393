"""Host work in a CUDA stream's order, for `host_drafting: stream` (`speculator.py`).

`launch(job)` enqueues `job` on the current CUDA stream as a host function (the driver's `cuLaunchHostFunc`): the
driver runs it on its own callback thread once everything enqueued before it is done, and everything enqueued after
it waits for it. `copy(dst, src)` is a non-blocking copy, ordered on the same stream. So `propose` can enqueue
"copy the step's counts to the host, draft on the host, copy the drafts back" and return at once: the runner goes
on to prepare the next step while the GPU finishes sampling and the host drafts, instead of waiting for both.

A job must not call CUDA (the driver forbids it on its callback thread) and must not raise (nothing would see it):
the speculator's job catches everything and reports it at its next call.

`QueuedStreamOrder` runs the same contract without a GPU: jobs and copies in one FIFO, run on a thread of its
own. The CPU tests drive the speculator with it, at chosen delays, to check that drafting in stream order gives
the drafts of drafting in place, whatever the timing.
"""

from __future__ import annotations

import ctypes
import itertools
import queue
import threading
from typing import Callable

import torch

Job = Callable[[], None]


class CudaStreamOrder:
    """Host functions and copies on the current CUDA stream of `device`."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        try:
            self._cuda = ctypes.CDLL("libcuda.so.1")
        except OSError as exc:
            raise RuntimeError(f"host_drafting 'stream': the CUDA driver library is not loadable ({exc})") from None
        self._cuda.cuLaunchHostFunc.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self._cuda.cuLaunchHostFunc.restype = ctypes.c_int
        self._callback = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(self._run)  # kept alive as long as self
        self._jobs: dict[int, Job] = {}
        self._keys = itertools.count(1)  # user data 0 would arrive as None

    def launch(self, job: Job) -> None:
        key = next(self._keys)
        self._jobs[key] = job
        stream = torch.cuda.current_stream(self.device).cuda_stream
        rc = self._cuda.cuLaunchHostFunc(ctypes.c_void_p(stream), self._callback, ctypes.c_void_p(key))
        if rc != 0:
            self._jobs.pop(key, None)
            raise RuntimeError(f"host_drafting 'stream': cuLaunchHostFunc failed (CUresult {rc})")

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def _run(self, key: int) -> None:
        self._jobs.pop(key)()


class QueuedStreamOrder:
    """The stream-order contract on the CPU: one FIFO of jobs and copies, run by a thread of its own. `delay(i)`,
    where given, is called before the i-th entry runs (a test's way to vary the timing)."""

    def __init__(self, delay: Callable[[int], None] | None = None) -> None:
        self._queue: queue.Queue = queue.Queue()
        self._delay = delay
        self._count = 0
        self._thread = threading.Thread(target=self._loop, name="spec-plugins-stream", daemon=True)
        self._thread.start()

    def launch(self, job: Job) -> None:
        self._queue.put(job)

    def copy(self, dst: torch.Tensor, src: torch.Tensor) -> None:
        self._queue.put(lambda: dst.copy_(src))

    def synchronize(self) -> None:
        """Wait until everything enqueued so far has run (what reading a device result waits for)."""
        done = threading.Event()
        self._queue.put(done.set)
        done.wait()

    def _loop(self) -> None:
        while True:
            entry = self._queue.get()
            if self._delay is not None:
                self._delay(self._count)
            self._count += 1
            entry()
