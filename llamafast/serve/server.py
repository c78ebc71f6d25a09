"""Running the server: the listening socket, uvicorn, the engine thread, and the way out. SIGTERM or Ctrl-C stops
taking requests, answers the queued ones 503, lets the one in flight finish, and returns; a second signal ends the
one in flight at its next token. Neither path raises: the caller exits 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass

import uvicorn

from llamafast.config import SamplingConfig
from llamafast.errors import LlamafastError
from llamafast.serve.app import MAX_BODY_BYTES, create_app
from llamafast.serve.completions import Served
from llamafast.serve.metrics import Metrics
from llamafast.serve.runner import Hooks, ModelSetup, open_runner
from llamafast.serve.worker import Worker

# Requests that may wait while one decodes: each waits for the ones before it, so a deep queue only lengthens the
# wait; past it a client gets 503 with Retry-After at once and can go elsewhere.
DEFAULT_MAX_QUEUE = 16


@dataclass(frozen=True)
class ServeOptions:
    api_key: str | None = None
    max_queue: int = DEFAULT_MAX_QUEUE
    name: str | None = None  # the model's id in the API; default: its path's last component
    max_tokens: int | None = None  # a request's default; None: as many as the context leaves
    max_body: int = MAX_BODY_BYTES


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (port 0: any free port), so that a busy port or an unknown host is one
    error before anything loads, and clients that connect while the model loads wait in the backlog."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as e:
        raise LlamafastError(f"--host {host}: not an address this machine can listen on ({e})") from None
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise LlamafastError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None
    return sock


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    with contextlib.suppress(ValueError):
        return ipaddress.ip_address(host).is_loopback
    return False


def url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class _NoTracebacks(logging.Filter):
    """uvicorn logs an exception it catches with its traceback; the server says it in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            e = record.exc_info[1]
            record.msg = f"{record.getMessage().strip()} ({type(e).__name__}: {' '.join(str(e).split())})"
            record.args, record.exc_info, record.exc_text = (), None, None
        return True


def serve(setup: ModelSetup, sampling: SamplingConfig, options: ServeOptions, sock: socket.socket,
          on_ready: Callable[[], None] = lambda: None, hooks: Hooks = Hooks()) -> None:
    """Serves setup's model on sock until SIGTERM or Ctrl-C. The model loads on the engine thread while the server
    already answers (/health 503); on_ready is called once it is ready. A model that fails to load raises its
    error here, once the server has stopped."""
    opened = setup.opened
    metrics = Metrics()
    path = opened.checkpoint.path
    name = options.name or path.name
    served = Served(opened.tokenizer, name, frozenset({name, path.name, str(path)}),
                    setup.context or opened.config.max_seq_len, sampling, options.max_tokens, options.api_key)
    server: _Server | None = None

    def on_state(state: str) -> None:  # on the engine thread
        with contextlib.suppress(RuntimeError):  # the loop has closed: the server has stopped already
            if state == "ready" and not server.should_exit:  # a model ready after SIGTERM is not announced
                server.loop.call_soon_threadsafe(on_ready)
            elif state == "failed":
                server.loop.call_soon_threadsafe(server.stop)

    worker = Worker(lambda: open_runner(setup, sampling, metrics, hooks), options.max_queue, metrics, on_state)
    app = create_app(served, worker, metrics, options.max_body)
    # lifespan off: the engine thread starts and stops in _Server.serve, so that even a forced exit stops it in
    # order (uvicorn skips the lifespan's shutdown then, and cancels it).
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", http="h11", loop="asyncio")
    server = _Server(config, worker)
    config.load()  # configures uvicorn's loggers, which the filter then joins
    logging.getLogger("uvicorn.error").addFilter(_NoTracebacks())
    server.run(sockets=[sock])
    if worker.state == "failed":
        raise LlamafastError(worker.error)


class _Server(uvicorn.Server):
    """uvicorn's server, with the engine told of the shutdown as soon as a signal arrives, and without uvicorn's
    re-raising of that signal once it has stopped (which would end the process with it, not with status 0)."""

    def __init__(self, config: uvicorn.Config, worker: Worker):
        super().__init__(config)
        self.worker, self.loop = worker, None

    async def serve(self, sockets=None) -> None:
        """uvicorn's serve between the engine thread's start and its end. After a forced exit (a second signal)
        the request in flight ends at its next token, and its response ends before the loop does, so that no
        response task is cancelled mid-way."""
        self.loop = asyncio.get_running_loop()
        self.worker.start()
        try:
            await super().serve(sockets)
        finally:
            self.worker.close(halt=self.force_exit)
            for _ in range(50):  # responses left after a forced exit: at most 5 s, each ends at its next event
                if not self.server_state.tasks:
                    break
                await asyncio.sleep(0.1)
            await asyncio.to_thread(self.worker.thread.join)

    def stop(self) -> None:
        self.should_exit = True

    @contextlib.contextmanager
    def capture_signals(self):
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in original.items():
                signal.signal(sig, handler)

    def handle_exit(self, sig, frame) -> None:
        """In the signal handler: flags only; the engine hears of it on the loop."""
        self.force_exit = self.should_exit
        self.should_exit = True
        if self.loop is not None:
            with contextlib.suppress(RuntimeError):
                self.loop.call_soon_threadsafe(self.worker.close, self.force_exit)
