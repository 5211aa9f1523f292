"""The exceptions the CLI turns into one line on stderr.

An :class:`InputError` (exit code 2) is a problem with what the user gave us, so every
message names the file (or config key) and the problem on its own. A
:class:`TrainingDivergedError` (exit code 3) is a run that went wrong on valid input.
:func:`one_line` is the one way any exception becomes such a line.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad user input: a file, a sheet or a config value that cannot be used."""

    def __init__(self, source: object, problem: str) -> None:
        self.source = str(source)
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")


class TrainingDivergedError(RuntimeError):
    """A training loss became NaN or infinite."""


def one_line(message: object, limit: int = 500) -> str:
    """An exception (or any message) as one line of at most ``limit`` characters.

    Tracebacks and multi-line messages of third-party libraries would otherwise spread one
    failure over many lines of a log or a report cell.
    """
    text = " ".join(str(message).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
