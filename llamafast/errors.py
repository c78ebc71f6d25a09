"""The one exception type for bad input: the CLI prints its message on one line and exits with 1."""


class LlamafastError(Exception):
    pass


class SharedError(LlamafastError):
    """An error every tensor-parallel rank raises alike (agreed over the ranks, or found in the environment that
    torchrun gives them all): rank 0 reports it and the others exit with its status, so it is printed once."""


def persistent_refusal(reason: str) -> LlamafastError:
    """The persistent decode step compiles the weights' formats into its one kernel: layers that mix formats it
    does not take (kernels/decode_step_plan.formats_refusal gives the reason) are refused, pointing at the per-op
    kernels that run them."""
    return LlamafastError(f"the persistent backend cannot run this model's weights: {reason}; run it with --backend "
                          f"triton")
