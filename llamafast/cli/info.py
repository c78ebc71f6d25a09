"""`llamafast info`: a checkpoint or a known shape, described from headers alone."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.markup import escape

from llamafast.cli.common import ModelOpt, TokenizerOpt, clean_errors, err
from llamafast.errors import LlamafastError


def info(
    model: ModelOpt = None,
    shape: Annotated[Optional[str], typer.Option(help="Describe a known shape (llama-2-7b, ...) instead of a checkpoint.")] = None,
    tokenizer: TokenizerOpt = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
):
    """Describe a checkpoint: format, config, parameters, each tensor group's format and the bytes read per token."""
    from llamafast.tools import describe

    with clean_errors():
        if shape and (model or tokenizer):
            raise LlamafastError("--shape describes a known shape; it does not go with --model or --tokenizer")
        data = describe.describe_shape(shape) if shape else describe.describe_checkpoint(model, tokenizer)
        if "problem" in data:
            err.print(f"warning: {escape(data['problem'])}")
        if json_out:
            print(json.dumps(data))
            return
        for key, value in data.items():
            print(f"{key + ':':28}{_fmt(key, value)}")


def _fmt(key: str, value) -> str:
    if key == "formats":  # attention: q4_0, ffn: q4_0, lm_head: q8_0, ...
        return ", ".join(f"{k}: {v}" for k, v in value.items() if v is not None)
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items() if v is not None)
    if "bytes" in key:
        return f"{value / 1e9:.3f} GB ({value:,} bytes)" if value >= 1e8 else f"{value:,} bytes"
    if key == "parameters":
        return f"{value:,}"
    return str(value)
