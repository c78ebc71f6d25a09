"""The interpreter block tests' cases run natively on a GPU (fp32, BLOCKY's 2 layers, the tests' launches): per
step, the relative logit error of the persistent step and of the per-op graph against the reference's int8 model,
the two kernels' distance from each other, and the persistent step's from a second run of itself (a race would
show as a run that differs). From the repository root on a GPU:

    PYTHONPATH=. python scripts/experiments/persistent_mixed_errors.py [STEPS]
"""
import sys

import torch

sys.path.insert(0, ".")
from tests.kernels.common import DEVICE  # noqa: E402
from tests.kernels.test_decode_step import BLOCKY, MIXES, _twins  # noqa: E402

from llamafast.backends import with_backend  # noqa: E402
from llamafast.config import Backend, WeightFormat  # noqa: E402
from llamafast.kernels.decode_step_plan import StepConfig  # noqa: E402


STEPS, PROMPT = int(sys.argv[1]) if len(sys.argv) > 1 else 16, 3


def logits(model, tokens):
    out = []
    with torch.no_grad():
        model.setup_cache(len(tokens))
        model(tokens[:PROMPT], torch.zeros((), dtype=torch.long, device=DEVICE))
        for i in range(PROMPT, len(tokens)):
            out.append(model(tokens[i: i + 1], torch.tensor(i, device=DEVICE)).float())
    return out


def rel(a, b):
    return max(((x - y).norm() / y.norm()).item() for x, y in zip(a, b)), [
        f"{((x - y).norm() / y.norm()).item():.1e}" for x, y in zip(a, b)]


cases = [(f.value, f, StepConfig((64, 128), (64, 128), (64, 512), (64, 256), 4, 1, stages=1 if f.bits == 4 else 2))
         for f in (WeightFormat.q4_1, WeightFormat.q4_k, WeightFormat.q6_k)]
cases += [(f"{m.base.value}-{m.more.value}", m, StepConfig((64, 128), (64, 128), (64, 512), (64, 256), 4, 1, 2))
          for m in MIXES]
tokens = torch.randint(0, BLOCKY.vocab_size, (PROMPT + STEPS,), generator=torch.Generator().manual_seed(0)).to(DEVICE)
for name, fmt, cfg in cases:
    ref, fused = _twins(BLOCKY, torch.float32, None, fmt)
    base = fmt.base.value if hasattr(fmt, "base") else fmt.value
    fused.backend.launches["decode_step"][(BLOCKY.dim, BLOCKY.hidden_dim, base)] = cfg
    want, got, again = logits(ref, tokens), logits(fused, tokens), logits(fused, tokens)
    per_op = logits(with_backend(fused, Backend.triton), tokens)
    for label, a, b in (("persistent vs ref", got, want), ("per-op vs ref", per_op, want),
                        ("persistent vs per-op", got, per_op), ("persistent vs itself", again, got)):
        worst, steps = rel(a, b)
        print(f"{name:10s} {label:22s} max {worst:.2e}  {' '.join(steps)}", flush=True)
