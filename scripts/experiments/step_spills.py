"""The persistent decode step's kernel compiled for an H100 (sm_90a) on a machine without a GPU: Triton is told it
targets one, compiles the 7B-shaped step (4 layers, random weights) in bf16, FP8, a block format or llama.cpp's
Q4_K_M mix on its default launch (decode_step_plan.step_config), and ptxas reports its registers and spills at the
launch's register cap. Nothing is launched. From the repository root, with the project importable:

    python scripts/experiments/step_spills.py q4_k_m|q4_k|q4_0|q8_0|q6_k|bf16|fp8_e5m2|fp8_e4m3 ...
"""
import dataclasses
import os
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.backends.nvidia.compiler import get_ptxas  # noqa: E402
from triton.runtime import driver  # noqa: E402

from llamafast.backends import build, layer_tensors  # noqa: E402
from llamafast.config import MODEL_CONFIGS, Backend, WeightFormat  # noqa: E402
from llamafast.kernels import decode_step  # noqa: E402
from llamafast.kernels import decode_step_args  # noqa: E402
from llamafast.kernels import decode_step_plan as plan  # noqa: E402
from llamafast.load.blocks import MIXES, block_state, copy_formats  # noqa: E402
from llamafast.load.shard import Shard, random_shard  # noqa: E402
from llamafast.load.weights import random_state  # noqa: E402
from llamafast.quant import FP8Format  # noqa: E402


class H100:
    """Just enough of a CUDA driver for Triton to compile (not launch) for sm_90."""

    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0

    def get_device_interface(self):
        return torch.cuda

    def map_python_to_cpp_type(self, t):
        return t


def report(name: str) -> str:
    config = dataclasses.replace(MODEL_CONFIGS["llama-2-7b"], n_layers=4, vocab_size=256)
    if name == "bf16" or name.startswith("fp8_"):
        fp8 = FP8Format(name.removeprefix("fp8_")) if name != "bf16" else None
        state = random_shard(config, Shard(0, 1), torch.device("cpu"), torch.bfloat16, 0, fp8)
        model = build(config, state, Backend.reference, fp8.format if fp8 else WeightFormat.float)
    else:
        fmt = MIXES.get(name) or WeightFormat(name)
        *fmts, others = copy_formats(fmt, config)
        state = block_state(random_state(config, torch.device("cpu"), torch.bfloat16), fmt, config)
        model = build(config, state, Backend.reference, *fmts, formats=others)
    model.setup_cache(64)
    decode_step_args.INTERPRET = plan.INTERPRET = False  # the launch of a GPU, not the interpreter's
    step = decode_step.DecodeStep(layer_tensors(model), model.rope_cos, model.rope_sin, config.n_heads,
                                  config.norm_eps)
    args, meta = step._args(torch.zeros(1, config.dim, dtype=torch.bfloat16), torch.zeros((), dtype=torch.long))
    meta.update(SEQUENTIAL=False)
    kernel = decode_step._decode_step_kernel.warmup(*args, 1, grid=(1,), **meta)
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(kernel.asm["ptx"])
    cap = ["--maxrregcount", str(step.cfg.max_registers)] if step.cfg.max_registers else []
    ptxas = subprocess.run([get_ptxas(90).path, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull, *cap],
                           capture_output=True, text=True).stderr
    lines = [line.strip() for line in ptxas.splitlines() if "spill" in line or "registers" in line]
    return f"{name}: {step.cfg}\n  " + "\n  ".join(lines)


if __name__ == "__main__":
    driver.set_active(H100())
    for name in sys.argv[1:] or ["q4_k_m"]:
        print(report(name), flush=True)
