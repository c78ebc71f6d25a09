"""Writes a Hugging Face format checkpoint of random weights at a Llama 2 shape (2 safetensors shards with an
index, bf16, Q/K rows permuted as HF does), to time `llamafast convert-fp8` on a real-size file from disk.
Random numbers are drawn on the GPU when there is one. Needs a tokenizer.model to copy beside it.

    PYTHONPATH=. python scripts/make_random_checkpoint.py --shape llama-2-7b --tokenizer T DST
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from llamafast.formats import expected_shapes
from llamafast.config import model_config
from tests.formats import write_hf


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("dst", type=Path)
    parser.add_argument("--shape", default="llama-2-7b")
    parser.add_argument("--tokenizer", type=Path, required=True)
    args = parser.parse_args()
    config = model_config(args.shape)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    gen = torch.Generator(device=device).manual_seed(0)
    state = {}
    for name, shape in expected_shapes(config).items():
        t = torch.empty(shape, device=device, dtype=torch.bfloat16)
        t.fill_(1.0) if len(shape) == 1 else t.normal_(0.0, shape[1] ** -0.5, generator=gen)
        state[name] = t.cpu()
    write_hf(args.dst, config, state, n_shards=2, tokenizer=args.tokenizer, dtype=torch.bfloat16)


if __name__ == "__main__":
    main()
