"""The one exception type that user-facing commands turn into a one-line error and a non-zero exit."""


class PipesplitError(ValueError):
    """Bad input or an impossible request; the message says what was wrong and what to do."""


def one_line(e: BaseException) -> str:
    """An exception as one line: its type and first line, with its cause's where that line says nothing
    more than "failed:" (torch's pipelining stages raise so)."""
    text = str(e).strip().splitlines()
    line = f"{type(e).__name__}: {text[0] if text else ''}".rstrip()
    cause = e.__cause__ or e.__context__
    if cause is not None and (line.endswith(":") or not text):
        line = f"{line.rstrip(':')}: {one_line(cause)}"
    return line[:400]
