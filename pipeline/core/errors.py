"""The one exception type that user-facing commands turn into a one-line error and a non-zero exit."""


class PipesplitError(ValueError):
    """Bad input or an impossible request; the message says what was wrong and what to do."""
