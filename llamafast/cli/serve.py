"""`llamafast serve`: the model behind an OpenAI-compatible HTTP API (llamafast/serve/)."""

from __future__ import annotations

import contextlib
from typing import Annotated, Optional

import typer

from llamafast.cli.common import (
    GENERATE_KEYS, BackendOpt, ConfigOpt, DeviceOpt, DTypeOpt, FP8FormatOpt, FP8Opt, ModelOpt, PenaltyOpt,
    SparseModeOpt, SparsityOpt, TemperatureOpt, TokenizerOpt, TopKOpt, TopPOpt, check_sparsity, clean_errors,
    context_size, device_or_default, path_or, pick, preset, sampling_config, say_tuned, say_tuning, warn, open_noted,
)
from llamafast.config import FP8Format, SparseMode
from llamafast.errors import LlamafastError

# serve's default queue (llamafast.serve.DEFAULT_MAX_QUEUE), written here so that --help imports no server.
DEFAULT_MAX_QUEUE = 16

HostOpt = Annotated[str, typer.Option(help="Address to listen on; 0.0.0.0 listens on every interface (give --api-key).")]
PortOpt = Annotated[int, typer.Option(help="Port to listen on; 0 picks a free one (the ready line names it).")]
KeyOpt = Annotated[Optional[str], typer.Option(
    help="Require Authorization: Bearer KEY on every endpoint but /health (default: LLAMAFAST_API_KEY, else none).")]


def serve(
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
    host: HostOpt = "127.0.0.1",
    port: PortOpt = 8000,
    api_key: KeyOpt = None,
    name: Annotated[Optional[str], typer.Option(
        help="The model's id in the API [default: the checkpoint path's last component]; requests may also name "
             "the path.")] = None,
    max_queue: Annotated[int, typer.Option(
        help="Requests that may wait while one decodes; past that, 503 with Retry-After.")] = DEFAULT_MAX_QUEUE,
    context: Annotated[Optional[int], typer.Option(
        help="KV cache positions: prompt plus completion [default: the model's context].")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(
        help="max_tokens of a request that gives none [default: as many as the context leaves].")] = None,
    temperature: TemperatureOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    repetition_penalty: PenaltyOpt = None,
    seed: Annotated[Optional[int], typer.Option(help="Seed of a request that gives none [default: a random one "
                                                     "per request].")] = None,
    device: DeviceOpt = None,
    dtype: DTypeOpt = None,
    fp8: FP8Opt = False,
    fp8_format: FP8FormatOpt = FP8Format.e5m2,
    backend: BackendOpt = None,
    sparsity: SparsityOpt = None,
    sparse_mode: SparseModeOpt = SparseMode.router,
    tp: Annotated[Optional[int], typer.Option("--tp", hidden=True)] = None,
    config: ConfigOpt = None,
):
    """Serve a model over an OpenAI-compatible HTTP API (chat and text completions, streaming, /v1/models, /health,
    /metrics, /tokenize): one request decodes at a time, the others wait in a queue. Ctrl-C or SIGTERM finishes the
    request in flight and stops."""
    from llamafast.load import resolve_backend
    from llamafast.serve import Hooks, ModelSetup, ServeOptions, is_loopback, listen
    from llamafast.serve import serve as run_server
    from llamafast.serve import url
    from llamafast.settings import settings

    with clean_errors():
        if tp is not None and tp != 1:
            raise LlamafastError("serve runs on one GPU: it has no --tp; tensor parallel runs with generate and "
                                 "bench under torchrun, and serve --fp8 fits a larger model on one GPU")
        run = preset(config)
        run.refuse_unused("serve", GENERATE_KEYS)
        sampling = sampling_config(run, temperature, top_k, top_p, repetition_penalty, seed)
        key = api_key if api_key is not None else settings().api_key
        _check(port, max_queue, key)
        dev = device_or_default(pick(device, run.device))
        resolve_backend(pick(backend, run.backend), dev)
        opened = open_noted(path_or(model, run.model), path_or(tokenizer, run.tokenizer))
        size = context_size(context, opened.config.max_seq_len)
        default_new = pick(max_new_tokens, run.max_new_tokens if "max_new_tokens" in run.keys else None)
        if default_new is not None and not 1 <= default_new < size:
            raise LlamafastError(f"--max-new-tokens must be at least 1 and leave room for a prompt in the context "
                                 f"of {size} tokens")
        sparse = check_sparsity(opened, sparsity, sparse_mode)
        sock = listen(host, port)
        if not is_loopback(host) and key is None:
            warn(f"listening on {host} without --api-key: anyone who can reach this port can use the model")
        setup = ModelSetup(opened, dev, pick(dtype, run.dtype), pick(backend, run.backend),
                           fp8_format if fp8 else None, size, sparse)
        options = ServeOptions(key, max_queue, name, default_new)
        address = url(sock)
        model_id = name or opened.checkpoint.path.name

        def ready() -> None:
            with contextlib.suppress(Exception):  # on the event loop: a closed stdout must not stop the server
                typer.echo(f"llamafast serve: {model_id} ready at {address}/v1 (context {size} tokens; "
                           "Ctrl-C stops)")

        with sock:
            run_server(setup, sampling, options, sock, ready,
                       Hooks(warn, say_tuning, lambda startup: say_tuned(startup.tuning)))


def _check(port: int, max_queue: int, key: str | None) -> None:
    if not 0 <= port <= 65535:
        raise LlamafastError(f"--port {port} is not a port; give 0 to 65535 (0: any free port)")
    if max_queue < 0:
        raise LlamafastError("--max-queue must be 0 or more (0: no request waits; a busy server answers 503)")
    if key is not None and not key.strip():
        raise LlamafastError("--api-key is empty; give a key, or leave the option out to serve without one")


