"""The one exception type for bad input: the CLI prints its message on one line and exits with 1."""


class LlamafastError(Exception):
    pass
