"""What a results table must say of the run behind it, recorded by every benchmark that
writes rows for one: the date, the commit (and whether the tree had uncommitted changes),
the machine and the call. ``results_tables.py`` reads it back."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
    return out.stdout.strip()


def machine() -> str:
    """The CPU's model name and core count, and the GPU when there is one."""
    import torch

    cpuinfo = Path("/proc/cpuinfo")
    names = [
        line.split(":", 1)[1].strip()
        for line in (cpuinfo.read_text().splitlines() if cpuinfo.exists() else [])
        if line.startswith("model name")
    ]
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    cpu = names[0] if names else platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cores" + (f", {gpu}" if gpu else "")


def record_run(work: Path, call: dict[str, Any]) -> None:
    """Append this run's record, with ``call`` (the settings that made its rows), to
    ``work``/runs.jsonl."""
    import torch

    row = {
        "date": time.strftime("%Y-%m-%d"),
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": machine(),
        "threads": int(os.environ.get("OMP_NUM_THREADS", "0")) or None,
        "torch": torch.__version__,
        **call,
    }
    with open(work / "runs.jsonl", "a") as fh:
        fh.write(json.dumps(row) + "\n")
