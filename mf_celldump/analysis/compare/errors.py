"""The one error a comparison raises for bad input (any module of the package may raise it)."""


class CompareInputError(ValueError):
    """The inputs cannot be compared (no dump, nothing pairs, bad option); the message says why."""
