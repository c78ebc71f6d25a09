"""What the sparse FFN's grouping buys on a real trained model: SmolLM2-135M-Instruct (its Q4_1 GGUF, on the CPU)
sparsified twice on the same calibration text and seed, once as `llamafast sparsify` groups neurons (k-means on
how they fire together) and once in groups of 32 neurons in the file's order (the groups that are whole GGUF
blocks of w2, whose blocks run along the neurons), then scored by `llamafast eval` on the same held-out stream.
From the repository root, with the project importable and ../shared beside it:

    python scripts/experiments/sparse_contiguous_groups.py OUTDIR
"""
import sys
from pathlib import Path

import torch

from llamafast.cli import app
from llamafast.sparse import calibrate

GGUF = "../shared/testdata/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = "scripts/results/sparse/quality/smollm2_calibration.txt"


def contiguous(features: torch.Tensor, n: int, group: int, gen: torch.Generator) -> torch.Tensor:
    """Neuron i in group i // group: the file's order, no clustering."""
    return torch.arange(features.shape[0], device=features.device) // group


def run(args: list[str]) -> None:
    print("$ llamafast " + " ".join(args), flush=True)
    try:
        app(args)
    except SystemExit as e:  # the command line's exit, with its status
        if e.code:
            raise


def main(out: Path) -> None:
    clustered = calibrate.balanced_groups
    for name, grouping in (("clustered", clustered), ("contiguous", contiguous)):
        calibrate.balanced_groups = grouping
        model = out / f"smollm2-{name}"
        run(["sparsify", GGUF, str(model), "--text", TEXT, "--device", "cpu", "--force"])
        run(["eval", "--device", "cpu", "--model", str(model), "--sparsity", "0.3,0.5",
             "--out", str(out / f"smollm2_{name}.json")])
    calibrate.balanced_groups = clustered


if __name__ == "__main__":
    main(Path(sys.argv[1]))
