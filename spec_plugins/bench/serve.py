"""`vllm serve` on 127.0.0.1 for tests and benchmarks: started in its own process group, stopped by PID."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _signal_group(pgid: int, sig: int) -> bool:
    """Send `sig` to a process group; False when no process of it is left."""
    try:
        os.killpg(pgid, sig)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:  # a recycled id that is not ours
        return False


class VllmServer:
    """`with VllmServer(model, ["--dtype", "float32", ...], log) as server: server.post(...)`.

    Uses the `vllm` console script next to this interpreter (the CPU setup gives it the metadata it
    needs). Exiting the block sends SIGTERM to the server's process group (its engine processes
    included), then SIGKILL if it has not stopped within `stop_timeout` seconds.
    """

    def __init__(self, model: str, args: list[str], log_path: str | Path, env: dict | None = None,
                 health_timeout: float = 300, stop_timeout: float = 60) -> None:
        self.model, self.args, self.log_path = model, list(args), Path(log_path)
        self.env = {**os.environ, **(env or {})}
        self.health_timeout, self.stop_timeout = health_timeout, stop_timeout
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "VllmServer":
        cli = os.path.join(os.path.dirname(sys.executable), "vllm")
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [cli, "serve", self.model, "--host", "127.0.0.1", "--port", str(self.port), *self.args],
                stdout=log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
            )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.health_timeout
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited with {self.proc.returncode}:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"vllm serve did not become healthy in {self.health_timeout:.0f} s")
            time.sleep(1)

    def stop(self) -> None:
        """SIGTERM to the server's process group, SIGKILL after stop_timeout. The group is signalled even when
        the server itself has already exited: its engine processes may outlive it."""
        if self.proc is None:
            return
        if not _signal_group(self.proc.pid, signal.SIGTERM):
            self.proc.wait()
            return
        try:
            self.proc.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            _signal_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        _signal_group(self.proc.pid, signal.SIGKILL)  # whatever of the group outlived the server

    def post(self, path: str, body: dict, timeout: float = 300) -> dict:
        req = urllib.request.Request(f"{self.url}{path}", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            raise RuntimeError(f"{path}: HTTP {exc.code}: {exc.read()[:500]!r}") from None

    def get(self, path: str, timeout: float = 30) -> str:
        with urllib.request.urlopen(f"{self.url}{path}", timeout=timeout) as resp:
            return resp.read().decode()

    def spec_decode_counts(self) -> dict[str, int]:
        """vLLM's speculative-decoding counters from `/metrics`, summed over labels: drafts, draft tokens, accepted
        tokens (0 each before the first draft)."""
        counts = {"drafts": 0, "draft_tokens": 0, "accepted": 0}
        names = {"vllm:spec_decode_num_drafts_total": "drafts",
                 "vllm:spec_decode_num_draft_tokens_total": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
        for line in self.get("/metrics").splitlines():
            name = line.split("{", 1)[0].split(" ", 1)[0]
            if name in names:
                counts[names[name]] += int(float(line.rsplit(" ", 1)[1]))
        return counts
