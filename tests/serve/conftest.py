"""Real `llamafast serve` processes on loopback ports, started by the tests (no HTTP layer is mocked): the bundled
stories260K on the reference backend for most tests, SmolLM2's GGUF for a chat template with a system prompt.
Each server is stopped with SIGTERM at the end and must exit 0 without a traceback."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from ..conftest import TESTDATA

SMOLLM2 = TESTDATA / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
requires_smollm2 = pytest.mark.skipif(not SMOLLM2.is_file(), reason=f"test data not found at {SMOLLM2}")
# One thread for torch: the CPU runners are shared, and threads fighting over two cores make the 260K model's
# decode steps ten times slower (30 ms instead of 3).
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
# The bundled model's server: sixteen clients at once fit (one decoding, fifteen waiting), a seventeenth does not.
MAX_QUEUE = 15


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    process: subprocess.Popen
    port: int
    ready_line: str = ""
    stderr: str = field(default="", repr=False)
    headers: dict[str, str] = field(default_factory=dict)  # sent with /metrics (an API key)
    terminated: bool = field(default=False, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def metrics(self, client: httpx.Client | None = None) -> dict[str, float]:
        """The /metrics samples by their name and labels as written (`llamafast_completions_total{...}`)."""
        text = (client or httpx).get(self.url + "/metrics", headers=self.headers).text
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                if line and not line.startswith("#")}

    def terminate(self) -> None:
        """SIGTERM, once: a second one, reaching a server whose shutdown has put the default handlers back, would
        kill it (-15) before it exits 0 by itself."""
        if not self.terminated and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        self.terminated = True

    def stop(self, timeout: float = 60) -> int:
        """SIGTERM (unless sent already), then the exit status; stderr is kept."""
        self.terminate()
        try:
            _, self.stderr = self.process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            _, self.stderr = self.process.communicate()
        return self.process.returncode


def start(*args: str, env: dict | None = None, wait: bool = True, timeout: float = 120) -> Server:
    """`python -m llamafast serve ARGS --port P`; with wait, returns once the ready line is out."""
    port = free_port()
    cmd = [sys.executable, "-m", "llamafast", "serve", "--port", str(port), "--device", "cpu", *args]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or ENV,
                               cwd=Path(__file__).resolve().parents[2])
    server = Server(process, port)
    if wait:
        server.ready_line = wait_ready(server, timeout)
    return server


def wait_ready(server: Server, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    line = server.process.stdout.readline()  # blocks until the line or the end of the process
    if not line or time.monotonic() > deadline:
        code = server.stop()
        raise AssertionError(f"serve exited {code} before it was ready: {server.stderr[-2000:]}")
    return line


def stopped_cleanly(server: Server) -> None:
    code = server.stop()
    assert code == 0 and "Traceback" not in server.stderr, (code, server.stderr[-3000:])


@pytest.fixture(scope="session")
def stories():
    """The bundled stories260K, served on the reference backend (context 512)."""
    server = start("--max-queue", str(MAX_QUEUE))
    yield server
    stopped_cleanly(server)


@pytest.fixture(scope="session")
def client(stories):
    with httpx.Client(base_url=stories.url, timeout=120) as c:
        yield c


@pytest.fixture(scope="session")
def openai_client(stories):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=stories.url + "/v1", api_key="unused", max_retries=0, timeout=120)
