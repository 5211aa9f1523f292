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


class WriteError(OSError):
    """An output could not be written (disk full, no permission, ...).

    ``filename`` is the output's path and ``strerror`` the reason, whatever file the
    failing call was working on (often the temporary one), so the message names the path
    the user knows.
    """


def _write_error(target: Path, exc: OSError) -> WriteError:
    if isinstance(exc, WriteError):
        return exc
    reason = exc.strerror or str(exc) or type(exc).__name__
    return WriteError(exc.errno, f"cannot write: {' '.join(reason.split())}", str(target))


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it to ``path`` only on success.

    An :class:`OSError` while creating, writing or renaming becomes a :class:`WriteError`
    that names ``path``; the temporary file is removed whatever goes wrong.
    """
    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    except OSError as exc:
        raise _write_error(target, exc) from exc
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        # mkstemp creates the file readable by its owner only; outputs get the usual mode.
        umask = os.umask(0)
        os.umask(umask)
        tmp.chmod(0o666 & ~umask)
        yield tmp
        os.replace(tmp, target)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise _write_error(target, exc) from exc
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text(path: str | os.PathLike, text: str) -> None:
    """Atomically write ``text`` to ``path``."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
