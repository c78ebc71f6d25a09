"""The one exception type for bad input: the CLI prints its message on one line and exits with 1."""


class LlamafastError(Exception):
    pass


class SharedError(LlamafastError):
    """An error every tensor-parallel rank raises alike (agreed over the ranks, or found in the environment that
    torchrun gives them all): rank 0 reports it and the others exit with its status, so it is printed once."""


def persistent_refusal(fmts: list[str]) -> LlamafastError:
    """The persistent decode step's one kernel compiles one weight format for every layer: layers that mix formats
    (fmts, sorted: llama.cpp's Q4_K_M and Q5_K_M files give some layers' wv and w2 Q6_K) are refused by name,
    pointing at the per-op kernels that run them."""
    return LlamafastError(f"the persistent backend runs one weight format in every layer, and this model's layers "
                          f"mix {' and '.join(fmts)}; run it with --backend triton")
