"""Write outputs under a temporary name and rename them into place.

A rule that fails half-way must never leave a file that a later rule (or a rerun of
Snakemake) would take for a finished output.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` only on success."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    # mkstemp creates the file readable by its owner only; outputs get the usual mode.
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o666 & ~umask)
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """Atomically write ``text`` to ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
