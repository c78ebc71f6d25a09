"""`llamafast generate`: a prompt in, text streamed out as it is sampled."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from llamafast.cli.common import (
    GENERATE_KEYS, BackendOpt, ConfigOpt, DeviceOpt, DTypeOpt, FP8FormatOpt, FP8Opt, ModelOpt, PenaltyOpt,
    SparseModeOpt, SparsityOpt, TemperatureOpt, TokenizerOpt, TopKOpt, TopPOpt, check_context, check_sparsity,
    clean_errors, device_or_default, err, path_or, pick, preset, progress_bar, read_prompt, sampling_config,
    say_tuned, say_tuning, note, open_noted, utf8_options, warn,
)
from llamafast.cli.tp import (
    TP_COMM_HELP, TPOpt, attach_comm, check_tp_backend, on_every_rank, on_rank0, shared_seed, tensor_parallel,
)
from llamafast.config import FP8Format, SparseMode, TPComm
from llamafast.errors import LlamafastError


def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; - reads standard input.")] = None,
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
    prompt_file: Annotated[Optional[Path], typer.Option(help="Read the prompt from this file.")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in a chat template: Llama-2-chat's with a tokenizer.model, else the model's own (Jinja).")] = False,
    system: Annotated[Optional[str], typer.Option(help="System prompt for --chat.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Most tokens to generate [default: 256].")] = None,
    temperature: TemperatureOpt = None,
    top_k: TopKOpt = None,
    top_p: TopPOpt = None,
    repetition_penalty: PenaltyOpt = None,
    seed: Annotated[Optional[int], typer.Option(help="Same seed, same text (default: a random seed, reported with --json).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option(help="Stop before this string (repeatable).")] = None,
    echo: Annotated[bool, typer.Option("--echo", help="Print the prompt before the generated text.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming text.")] = False,
    device: DeviceOpt = None,
    dtype: DTypeOpt = None,
    fp8: FP8Opt = False,
    fp8_format: FP8FormatOpt = FP8Format.e5m2,
    backend: BackendOpt = None,
    sparsity: SparsityOpt = None,
    sparse_mode: SparseModeOpt = SparseMode.router,
    tp: TPOpt = None,
    tp_comm: Annotated[TPComm, typer.Option(help=TP_COMM_HELP + ".")] = TPComm.symm,
    config: ConfigOpt = None,
):
    """Generate text from a prompt, streaming it as it is sampled."""
    from llamafast import STARTED
    from llamafast.generate import Engine
    from llamafast.generate import generate as generate_text
    from llamafast.runtime import ready

    phases = {"import_s": time.perf_counter() - STARTED}  # llamafast's first import to here: torch and the rest
    with clean_errors(), tensor_parallel(tp, device) as ranks, contextlib.ExitStack() as stack:
        run, sampling, max_new = on_every_rank(ranks, lambda: _options(
            config, temperature, top_k, top_p, repetition_penalty, seed, max_new_tokens, chat, system, stop))
        text = on_rank0(ranks, lambda: read_prompt(prompt, prompt_file))
        dev = ranks.device if ranks else device_or_default(pick(device, run.device))
        phases["init_s"] = _init_device(dev)
        opened, ids, sparse = on_every_rank(ranks, lambda: _open(
            run, model, tokenizer, text, chat, system, max_new, sparsity, sparse_mode, backend, ranks, tp_comm))
        tok = opened.tokenizer
        if not text and not json_out:
            err.print("[dim]empty prompt: generating from the beginning-of-sequence token alone[/dim]")
        with progress_bar() as update:
            lm, startup = stack.enter_context(ready(opened, dev, pick(dtype, run.dtype), pick(backend, run.backend),
                                                    fp8_format if fp8 else None, update, ranks, say_tuning, warn))
        say_tuned(startup.tuning)
        comm_note = attach_comm(ranks, lm, tp_comm)
        if not json_out:
            note(comm_note)
        sampling = dataclasses.replace(sampling, seed=shared_seed(ranks, sampling.seed))
        lm.model.set_sparsity(sparse)
        engine = Engine(lm.model, sampling, len(ids) + max_new, n_vocab=tok.vocab_size)
        if echo and not json_out:
            _write(text)
        t_generate = time.perf_counter()
        done = generate_text(engine, tok, ids, max_new, stop or [], on_text=None if json_out else _write)
        phases.update(load_s=lm.load_s, ttft_s=done.ttft_s, first_step_s=done.first_step_s, decode_s=done.decode_s,
                      first_token_since_import_s=t_generate + done.ttft_s - STARTED,
                      kernels_preloaded=startup.kernels_preloaded)
        if json_out:
            record = {"prompt": text, "model": lm.source, "format": lm.format, "weights": lm.weights,
                      "backend": lm.backend.value, "device": str(dev), "load_s": lm.load_s, **done.to_dict(),
                      **_sparse_record(lm.model), **_tp_record(lm.model), "phases": phases}
            print(json.dumps(record, ensure_ascii=False))
            return
        _write("\n")
        tps = done.decode_tokens_per_s
        sparse_note = "".join(f"; {k} {v}" for k, v in _sparse_record(lm.model).get("sparse", {}).items())
        err.print(
            f"[dim]{len(done.token_ids)} tokens ({done.finish_reason}); ttft {done.ttft_s * 1e3:.1f} ms; "
            f"decode {f'{tps:.1f} tok/s' if tps else 'n/a'}; {lm.backend.value}, {lm.weights} weights, on {escape(str(dev))}"
            f"{sparse_note}[/dim]"
        )


def _options(config, temperature, top_k, top_p, repetition_penalty, seed, max_new_tokens, chat, system, stop):
    """The run preset, sampling and token count, checked (on every rank alike under tensor parallelism)."""
    run = preset(config)
    run.refuse_unused("generate", GENERATE_KEYS)
    sampling = sampling_config(run, temperature, top_k, top_p, repetition_penalty, seed)
    max_new = pick(max_new_tokens, run.max_new_tokens)
    if max_new < 1:
        raise LlamafastError("--max-new-tokens must be at least 1")
    if system is not None and not chat:
        raise LlamafastError("--system applies only with --chat")
    utf8_options(system, stop)
    return run, sampling, max_new


def _open(run, model, tokenizer, text, chat, system, max_new, sparsity, sparse_mode, backend, ranks, tp_comm):
    """The checkpoint opened, the prompt's token ids and the sparse run: all checked before any weights load."""
    check_tp_backend(ranks, pick(backend, run.backend), [tp_comm])
    opened = open_noted(path_or(model, run.model), path_or(tokenizer, run.tokenizer))
    ids = opened.tokenizer.chat(text, system) if chat else opened.tokenizer.encode(text)
    check_context(len(ids), max_new, opened.config.max_seq_len)
    sparse = check_sparsity(opened, sparsity, sparse_mode)
    if ranks and sparse:
        raise LlamafastError("--tp does not run sparsified checkpoints")
    return opened, ids, sparse


def _sparse_record(model) -> dict:
    """The sparse FFN's settings and the share of groups it actually skipped in this run's decode steps."""
    if model.sparse is None:
        return {}
    skipped = model.groups_skipped()
    return {"sparse": {"sparsity": model.sparse.sparsity, "mode": model.sparse.mode.value,
                       "groups_skipped": None if skipped is None else round(skipped, 4)}}


def _init_device(device) -> float:
    """Seconds to create the CUDA context (0 on the CPU), timed apart from loading (--json phases)."""
    import torch

    t0 = time.perf_counter()
    if device.type == "cuda":
        torch.zeros(1, device=device)
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _tp_record(model) -> dict:
    if model.comm is None:
        return {}
    return {"tensor_parallel": {"size": model.world, "comm": model.comm.name.value}}


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


