"""The one exception type for bad input: the CLI prints its message on one line and exits with 1."""


class LlamafastError(Exception):
    pass


class SharedError(LlamafastError):
    """An error every tensor-parallel rank raises alike (agreed over the ranks, or found in the environment that
    torchrun gives them all): rank 0 reports it and the others exit with its status, so it is printed once."""
