"""The wait of programmatic dependent launch, tied to the registers a kernel computes before it.

griddepcontrol.wait has no operands, so ptxas schedules it as early as it can and sinks the arithmetic on the
weight tiles read ahead of it (their conversion to fp32) after it, onto the path that waits on the kernel ahead.
wait_after passes the tiles through asm whose wait is predicated on a sum of its inputs: the predicate needs every
input, so the tiles are converted before the wait, while the kernel ahead still runs. The predicate, sum >= -inf
or unordered, holds for every value, NaN included, so the wait always runs (ptxas folds the plainer x == x or
unordered); the interpreter has no PTX and needs no wait.
"""

from __future__ import annotations

import triton
import triton.language as tl

from ._common import INTERPRET

_PACK = 16  # tile elements a wait is tied to: 2 waits a thread at SmolLM2's wo (2 rows, 1 warp); 4 made 8 of them
# and left one instruction more after the last (sass, scripts/experiments/tied_wait/sass.py)


def _tied_wait(pack: int) -> str:
    ins = [f"${2 * pack + i}" for i in range(2 * pack)]
    total = "".join(f"add.f32 t, t, {v}; " for v in ins[1:])
    moves = "".join(f"mov.f32 ${i}, {v}; " for i, v in enumerate(ins))
    return (f"{{ .reg .pred p; .reg .f32 t; mov.f32 t, {ins[0]}; {total}setp.geu.f32 p, t, 0fFF800000; "
            f"@p griddepcontrol.wait; {moves}}}")


_ASM = tl.constexpr(not INTERPRET)
_PACKED = tl.constexpr(_PACK)
_TIED = tl.constexpr(_tied_wait(_PACK))
_CONSTRAINTS = tl.constexpr(",".join(["=f"] * (2 * _PACK) + ["f"] * (2 * _PACK)))


@triton.jit
def wait_after(a, b):
    """a and b (fp32 tiles of one shape) unchanged, returned after the wait for the kernel ahead."""
    if _ASM:
        return tl.inline_asm_elementwise(_TIED, _CONSTRAINTS, [a, b], dtype=(tl.float32, tl.float32), is_pure=False,
                                         pack=_PACKED)
    return a, b
