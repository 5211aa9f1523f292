"""One exception type for problems with what the user gave us.

The CLI turns an :class:`InputError` into a single line on stderr and exit code 2, so
every message must name the file (or config key) and the problem on its own.
"""

from __future__ import annotations


class InputError(Exception):
    """Bad user input: a file, a sheet or a config value that cannot be used."""

    def __init__(self, source: object, problem: str) -> None:
        self.source = str(source)
        self.problem = problem
        super().__init__(f"{self.source}: {problem}")
