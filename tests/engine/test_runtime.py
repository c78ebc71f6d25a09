"""llamafast.runtime: random weights are readied as a checkpoint is, and a model built from a ready one (an FP8
copy, as bench makes) is tuned and reported the same way."""

from __future__ import annotations

import subprocess
import sys

import torch

from llamafast.config import FP8Format
from llamafast.load import quantized
from llamafast.runtime import ready, ready_built

CPU = torch.device("cpu")


def test_random_weights_and_their_fp8_copy_are_readied():
    with ready("stories260K", CPU) as (lm, startup):
        assert (lm.format, lm.source, lm.weights) == ("random", "stories260K", "float32")
        assert startup.load_s == lm.load_s and startup.tuning is None  # the reference backend launches no kernels
        assert startup.preload is None and startup.kernels_preloaded == 0  # kernels preload on a GPU only
        copy = quantized(lm, FP8Format.e5m2)
        again = ready_built(copy)
        assert copy.weights == "fp8_e5m2" and again.load_s == copy.load_s and again.tuning is None


def test_importing_the_runtime_imports_no_triton():
    """The reference and compile backends import no Triton (runtime.tune): kernel preloading and tuning import it
    when a fused backend runs."""
    code = "import sys, llamafast.runtime; print(sorted({'triton', 'llamafast.tuning'} & set(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[-2] == "[]"
