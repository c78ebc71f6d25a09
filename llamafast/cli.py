"""The llamafast command line: each command parses, calls the library, and prints what it returns."""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import torch
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from llamafast import info as info_lib
from llamafast.bench import copy_bandwidth, environment, run_bench
from llamafast.bench_kernels import bench_kernels
from llamafast.config import Backend, DType, RunConfig, SamplingConfig, load_preset, model_config
from llamafast.errors import LlamafastError
from llamafast.generate import Engine, generate as generate_text
from llamafast.load import DECODE_MODES, load_model, random_model, resolve_device

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)

ModelOpt = Annotated[Optional[Path], typer.Option("--model", "-m", help="Checkpoint: Meta or Hugging Face directory, llama2.c .bin, or llamafast. Default: the bundled stories260K.")]
TokenizerOpt = Annotated[Optional[Path], typer.Option(help="SentencePiece tokenizer.model (default: the one beside the checkpoint).")]
DeviceOpt = Annotated[Optional[str], typer.Option(help="cuda, cuda:N or cpu (default: cuda when available).")]
DTypeOpt = Annotated[Optional[DType], typer.Option(help="Activation and weight dtype (auto: the checkpoint's on CUDA, float32 on the CPU).")]
ConfigOpt = Annotated[Optional[Path], typer.Option("--config", help="A TOML run preset (see configs/); options given here override it.")]


@contextlib.contextmanager
def _clean_errors():
    """Bad input ends in one line on stderr and exit code 1, never a traceback."""
    try:
        yield
    except LlamafastError as e:
        typer.echo(f"error: {' '.join(str(e).split())}", err=True)
        raise typer.Exit(1) from None
    except torch.cuda.OutOfMemoryError as e:
        typer.echo(f"error: out of GPU memory: {str(e).splitlines()[0]}", err=True)
        raise typer.Exit(1) from None
    except KeyboardInterrupt:
        raise typer.Exit(130) from None


def _preset(path: Path | None) -> RunConfig:
    return load_preset(path) if path else RunConfig()


def _pick(value, default):
    return default if value is None else value


@contextlib.contextmanager
def _progress(description: str = "loading weights"):
    """Yields a (done, total) callback that shows a rich progress bar on stderr for work of 256 MiB or more."""
    bar = Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(), TransferSpeedColumn(),
        TimeRemainingColumn(), console=err, transient=True,
    )
    task = bar.add_task(description, total=None)

    def update(done: int, total: int) -> None:
        if total >= 256 << 20:  # small models load in a blink: no bar
            if not bar.live.is_started:
                bar.start()
            bar.update(task, completed=done, total=total)

    try:
        yield update
    finally:
        if bar.live.is_started:
            bar.stop()


def _device(name: str | None):
    device = resolve_device(name)
    if name is None and device.type == "cpu":
        err.print("llamafast: no CUDA GPU found; running the reference path on the CPU")
    return device


def _read_prompt(prompt: str | None, prompt_file: Path | None) -> str:
    if prompt_file is not None:
        if prompt is not None:
            raise LlamafastError("give either PROMPT or --prompt-file, not both")
        try:
            return prompt_file.read_text()
        except OSError as e:
            raise LlamafastError(f"cannot read --prompt-file {prompt_file}: {e.strerror}") from None
    if prompt is None:
        raise LlamafastError("no prompt: give PROMPT, --prompt-file, or - to read standard input")
    return sys.stdin.read() if prompt == "-" else prompt


def check_context(n_prompt: int, max_new: int, context: int) -> None:
    if n_prompt >= context:
        raise LlamafastError(f"the prompt is {n_prompt} tokens; the model's context is {context} tokens")
    if n_prompt + max_new > context:
        raise LlamafastError(
            f"the prompt ({n_prompt} tokens) plus --max-new-tokens {max_new} exceeds the context of {context} tokens; "
            f"use --max-new-tokens {context - n_prompt} or less"
        )


@app.command()
def generate(
    prompt: Annotated[Optional[str], typer.Argument(help="The prompt; - reads standard input.")] = None,
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
    prompt_file: Annotated[Optional[Path], typer.Option(help="Read the prompt from this file.")] = None,
    chat: Annotated[bool, typer.Option("--chat", help="Wrap the prompt in the Llama-2-chat template.")] = False,
    system: Annotated[Optional[str], typer.Option(help="System prompt for --chat.")] = None,
    max_new_tokens: Annotated[Optional[int], typer.Option(help="Most tokens to generate [default: 256].")] = None,
    temperature: Annotated[Optional[float], typer.Option(help="0 is greedy [default: 0.6].")] = None,
    top_k: Annotated[Optional[int], typer.Option(help="Sample from the k most likely tokens; 0 disables [default: 0].")] = None,
    top_p: Annotated[Optional[float], typer.Option(help="Nucleus sampling mass; 1 disables [default: 0.9].")] = None,
    repetition_penalty: Annotated[Optional[float], typer.Option(help="CTRL penalty for seen tokens; 1 disables [default: 1].")] = None,
    seed: Annotated[Optional[int], typer.Option(help="Same seed, same text (default: a random seed, reported with --json).")] = None,
    stop: Annotated[Optional[list[str]], typer.Option(help="Stop before this string (repeatable).")] = None,
    echo: Annotated[bool, typer.Option("--echo", help="Print the prompt before the generated text.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of streaming text.")] = False,
    device: DeviceOpt = None,
    dtype: DTypeOpt = None,
    backend: Annotated[Optional[Backend], typer.Option(help="Decode backend [default: reference].")] = None,
    config: ConfigOpt = None,
):
    """Generate text from a prompt, streaming it as it is sampled."""
    with _clean_errors():
        run = _preset(config)
        s = run.sampling
        sampling = SamplingConfig(
            _pick(temperature, s.temperature), _pick(top_k, s.top_k), _pick(top_p, s.top_p),
            _pick(repetition_penalty, s.repetition_penalty), _pick(seed, s.seed),
        )
        sampling.validate()
        max_new = _pick(max_new_tokens, run.max_new_tokens)
        if max_new < 1:
            raise LlamafastError("--max-new-tokens must be at least 1")
        text = _read_prompt(prompt, prompt_file)
        dev = _device(_pick(device, run.device))
        with _progress() as update:
            lm = load_model(
                _path(model, run.model), _path(tokenizer, run.tokenizer), dev, _pick(dtype, run.dtype),
                _pick(backend, run.backend), update,
            )
        tok = lm.tokenizer
        ids = tok.chat(text, system) if chat else tok.encode(text)
        context = lm.model.config.max_seq_len
        check_context(len(ids), max_new, context)
        engine = Engine(lm.model, sampling, len(ids) + max_new, DECODE_MODES[lm.backend])
        if echo and not json_out:
            _write(text)
        done = generate_text(engine, tok, ids, max_new, stop or [], on_text=None if json_out else _write)
        if json_out:
            record = {"prompt": text, "model": lm.source, "format": lm.format, "backend": lm.backend.value,
                      "device": str(dev), "load_s": lm.load_s, **done.to_dict()}
            print(json.dumps(record, ensure_ascii=False))
            return
        _write("\n")
        tps = done.decode_tokens_per_s
        err.print(
            f"[dim]{len(done.token_ids)} tokens ({done.finish_reason}); ttft {done.ttft_s * 1e3:.1f} ms; "
            f"decode {f'{tps:.1f} tok/s' if tps else 'n/a'}; {lm.backend.value} on {dev}[/dim]"
        )


def _path(value: Path | None, preset: str | None) -> Path | None:
    return value if value is not None else (Path(preset) if preset else None)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


@app.command()
def info(
    model: ModelOpt = None,
    shape: Annotated[Optional[str], typer.Option(help="Describe a known shape (llama-2-7b, ...) instead of a checkpoint.")] = None,
    tokenizer: TokenizerOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
):
    """Describe a checkpoint: format, config, parameters, dtype and bytes read per token."""
    with _clean_errors():
        data = info_lib.describe_shape(shape) if shape else info_lib.describe_checkpoint(model, tokenizer)
        if json_out:
            print(json.dumps(data))
            return
        for key, value in data.items():
            print(f"{key + ':':28}{_fmt(key, value)}")


def _fmt(key: str, value) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items() if v is not None)
    if "bytes" in key:
        return f"{value / 1e9:.3f} GB ({value:,} bytes)" if value >= 1e8 else f"{value:,} bytes"
    if key == "parameters":
        return f"{value:,}"
    return str(value)


@app.command()
def bench(
    model: ModelOpt = None,
    tokenizer: TokenizerOpt = None,
    random_weights: Annotated[bool, typer.Option("--random-weights", help="Random weights built on the device; needs --shape.")] = False,
    shape: Annotated[Optional[str], typer.Option(help="Shape for --random-weights: llama-2-7b, llama-2-13b, llama-2-70b, stories260K.")] = None,
    prompt_len: Annotated[Optional[int], typer.Option(help="Prompt tokens [default: 16].")] = None,
    new_tokens: Annotated[Optional[int], typer.Option(help="Tokens to decode [default: 256].")] = None,
    backend: Annotated[Optional[list[Backend]], typer.Option(help="Backends to compare (repeatable; default: all the device runs).")] = None,
    device: DeviceOpt = None,
    dtype: DTypeOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    out: Annotated[Optional[Path], typer.Option(help="Also write the JSON report to this file.")] = None,
    kernels: Annotated[bool, typer.Option("--kernels", help="Time each decode kernel against its reference at --shape instead.")] = False,
    context: Annotated[int, typer.Option(help="With --kernels: tokens of context for attention.")] = 4096,
    config: ConfigOpt = None,
):
    """Measure load time, time to first token, decode tokens/s and achieved memory bandwidth, per backend."""
    with _clean_errors():
        run = _preset(config)
        dev = _device(_pick(device, run.device))
        if kernels:
            return _bench_kernels(_pick(shape, run.shape) or "llama-2-7b", dev, _pick(dtype, DType.bfloat16), context, json_out, out)
        n_prompt, n_new = _pick(prompt_len, run.prompt_len), _pick(new_tokens, run.max_new_tokens)
        if n_prompt < 1 or n_new < 2:
            raise LlamafastError("--prompt-len must be at least 1 and --new-tokens at least 2")
        backends = backend or (list(Backend) if dev.type == "cuda" else [Backend.reference])
        lm = _bench_model(run, model, tokenizer, random_weights, shape, dev, dtype)
        check_context(n_prompt, n_new, lm.model.config.max_seq_len)
        report = run_bench(lm, backends, n_prompt, n_new)
        if out is not None:
            out.write_text(json.dumps(report.to_dict(), indent=1) + "\n")
        if json_out:
            print(json.dumps(report.to_dict()))
        else:
            _print_report(report)


def _bench_kernels(shape: str, dev, dtype: DType, context: int, json_out: bool, out: Path | None) -> None:
    if dev.type != "cuda":
        raise LlamafastError("--kernels times Triton kernels in CUDA graphs and needs a CUDA GPU")
    if dtype not in (DType.bfloat16, DType.float16):
        raise LlamafastError("--kernels: --dtype bfloat16 or float16")
    torch_dtype = torch.bfloat16 if dtype == DType.bfloat16 else torch.float16
    copy_bw = copy_bandwidth(dev)
    rows = bench_kernels(model_config(shape), torch_dtype, context, copy_bw)
    report = {"shape": shape, "dtype": dtype.value, "context": context, "copy_bw_gb_s": copy_bw,
              "environment": environment(dev), "kernels": [r.to_dict() for r in rows]}
    if out is not None:
        out.write_text(json.dumps(report, indent=1) + "\n")
    if json_out:
        print(json.dumps(report))
        return
    env = report["environment"]
    _console().print(f"{shape} {dtype.value}, context {context}, on {env['device']}; torch {env['torch']}, "
                     f"triton {env['triton']}; copy bandwidth {copy_bw:.0f} GB/s")
    table = Table("kernel", "MB", "µs", "GB/s", "% copy BW", "reference µs", "speedup")
    for r in rows:
        table.add_row(escape(r.name), f"{r.bytes / 1e6:.1f}", f"{r.us:.1f}", f"{r.gb_s:.0f}",
                      f"{100 * r.fraction_of_copy_bw:.1f}", f"{r.reference_us:.1f}", f"{r.speedup:.2f}x")
    total = sum(r.us for r in rows)
    table.add_row("total (one of each)", f"{sum(r.bytes for r in rows) / 1e6:.1f}", f"{total:.1f}",
                  f"{sum(r.bytes for r in rows) / total / 1e3:.0f}", "", f"{sum(r.reference_us for r in rows):.1f}", "")
    _console().print(table)


def _console() -> Console:
    """stdout; wide enough for the tables when it is a file or a pipe."""
    out = Console()
    return out if out.is_terminal else Console(width=200)


def _bench_model(run, model, tokenizer, random_weights, shape, dev, dtype):
    shape = _pick(shape, run.shape)
    if random_weights or run.random_weights:
        if shape is None:
            raise LlamafastError("--random-weights needs --shape (llama-2-7b, llama-2-13b, llama-2-70b, stories260K)")
        return random_model(shape, dev, _pick(dtype, DType.bfloat16 if dev.type == "cuda" else DType.float32))
    if shape is not None:
        raise LlamafastError("--shape only applies with --random-weights")
    with _progress() as update:
        return load_model(_path(model, run.model), _path(tokenizer, run.tokenizer), dev, _pick(dtype, run.dtype), None, update)


def _print_report(r) -> None:
    env = r.environment
    out = _console()
    out.print(
        f"{r.model} ({r.format}, {r.dtype}, {r.params / 1e9:.3f} B params) on {env['device']}; "
        f"torch {env['torch']}, triton {env['triton']}; load {r.load_s:.2f} s; "
        f"copy bandwidth {r.copy_bw_gb_s:.0f} GB/s; prompt {r.prompt_tokens}, new {r.new_tokens}"
    )
    table = Table("backend", "startup s", "ttft ms", "prefill tok/s", "decode tok/s", "ms/token", "GB/s",
                  "% copy BW", "peak GB")
    for x in r.results:
        table.add_row(
            x.backend, f"{x.startup_s:.2f}", f"{x.ttft_ms:.2f}", f"{x.prefill_tokens_per_s:.0f}",
            f"{x.decode_tokens_per_s:.1f}", f"{x.decode_ms_per_token:.3f}", f"{x.achieved_gb_s:.0f}",
            f"{100 * x.fraction_of_copy_bw:.1f}", "-" if x.peak_memory_gb is None else f"{x.peak_memory_gb:.1f}",
        )
    out.print(table)
