"""The one exception type for bad input: the CLI prints its message on one line and exits with 1."""


class LlamafastError(Exception):
    pass


class SharedError(LlamafastError):
    """An error every tensor-parallel rank raises alike (agreed over the ranks, or found in the environment that
    torchrun gives them all): rank 0 reports it and the others exit with its status, so it is printed once."""


def persistent_refusal(fmt: str) -> LlamafastError:
    """The persistent decode step's one kernel runs float and FP8 weights: layers in a block format (fmt: q8_0,
    q4_0, q4_1) are refused by name, pointing at the per-op kernels that run them."""
    return LlamafastError(f"the persistent backend runs float and FP8 weights, not {fmt} blocks; "
                          "run them with --backend triton")
