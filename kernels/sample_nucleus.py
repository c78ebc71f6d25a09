"""The sampler's second launch for top-p (sample_token.py): the drawn token's nucleus test over every program's
share of the row, then any further rounds in the last program.

    above = sum over the ids whose z = (l - max l) / T exceeds the drawn token's of exp(z)
    keep the token when above < top_p * (the candidates' whole mass), else draw again among those ids (redraws)

The first launch's last program leaves the row's max, its mass, the drawn token's z and the likeliest token after
the programs' shares in its partials buffer (STATE values) and the drawn token in the output; here a program per
share sums its part of the mass above, and the last to finish (a ticket) adds the parts and decides, where the
first launch's last program walked the whole row alone. One H100, one process (scripts/experiments/sampling_cost/
nucleus/h100/): the sampler alone at temperature 0.6 with top-p 0.9, 20.7 -> 18.1 us at a vocabulary of 49,152,
17.2 -> 16.8 at 32,000 (no filter, either way: 10.3-10.4 and 10.2), with a repetition penalty 24.4 -> 19.6 and
20.2 -> 18.2; in the decode step, SmolLM2's shape 387.1-388.0 -> 385.0-385.2 us (with the penalty 393.3-396.0 ->
387.0-388.1), 7B bf16 4,601.9-4,602.7 -> 4,600.9-4,601.7 (4,605.1-4,605.8 -> 4,604.5)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_attention import tickets
from .sample_passes import redraws, row_pass

STATE = 4  # values the first launch leaves after its partials: max, mass, the drawn token's z, the likeliest


@triton.jit
def _nucleus_kernel(
    logits_ptr, seen_ptr, counts_ptr, draw_ptr, out_ptr,  # as sample_token's; out holds the first launch's draw
    part_ptr, ticket_ptr,  # part (PROGRAMS * 8 + STATE,) fp32: the first launch's, reused for the parts of above
    n, span, temperature, top_p, repetition, frequency, presence,
    CHUNK: tl.constexpr, REPETITION: tl.constexpr, OPENAI: tl.constexpr, ROUNDS: tl.constexpr,
    STRIDE: tl.constexpr, STAGES: tl.constexpr, PROGRAMS: tl.constexpr, BLOCK_P: tl.constexpr,
):
    pid = tl.program_id(0)
    state = part_ptr + PROGRAMS * 8
    m, zt = tl.load(state), tl.load(state + 2)
    lo = pid * span
    _, _, above = row_pass(logits_ptr, seen_ptr, counts_ptr, lo, tl.minimum(lo + span, n), m, temperature, 0, zt,
                           0, 0, repetition, frequency, presence, CHUNK, REPETITION, OPENAI, False, False, STAGES)
    tl.store(part_ptr + pid * 8, above)
    tl.debug_barrier()  # every thread's part stored before the ticket releases it
    ticket = tl.atomic_add(ticket_ptr, 1, sem="acq_rel", scope="gpu")
    if ticket == PROGRAMS - 1:
        tl.atomic_xchg(ticket_ptr, 0, sem="relaxed", scope="gpu")  # zero again for the next call
        p = tl.arange(0, BLOCK_P)
        above = tl.sum(tl.load(part_ptr + p * 8, mask=p < PROGRAMS, other=0.0), 0)
        step = tl.load(draw_ptr + 1) - 1  # the first launch counted this call
        token = redraws(logits_ptr, seen_ptr, counts_ptr, n, m, temperature, 0, zt, above, tl.load(state + 1),
                        top_p, tl.load(out_ptr).to(tl.int32), tl.load(state + 3).to(tl.int32), tl.load(draw_ptr),
                        step * ROUNDS * STRIDE, repetition, frequency, presence, CHUNK, REPETITION, OPENAI, False,
                        ROUNDS, STRIDE, STAGES)
        tl.store(out_ptr, token.to(tl.int64))


def nucleus(logits: torch.Tensor, seen: torch.Tensor, counts: torch.Tensor, draw: torch.Tensor, out: torch.Tensor,
            part: torch.Tensor, n: int, span: int, temperature: float, top_p: float, penalties: tuple, flags: dict):
    """After sample_token's first launch over shares of span ids (no top-k): out (1,) int64 becomes the token the
    nucleus keeps. penalties: (repetition, frequency, presence); flags: the first launch's meta-parameters."""
    programs = flags["PROGRAMS"]
    assert part.numel() == programs * 8 + STATE and programs > 1, "the first launch's partials, over programs"
    _nucleus_kernel[(programs,)](logits, seen, counts, draw, out, part, tickets(logits.device, 1), n, span,
                                 temperature, top_p, *penalties, **flags)
