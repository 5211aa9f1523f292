"""One benchmark step in a child process of its own: its wall time and peak memory.

Shared by the scale benchmarks (``baselines_scale.py``, ``metrics_scale.py``), which time
each workflow command as the rules run it, one child per step, so that a step's peak is
its own (``os.wait4`` gives that child's ``ru_maxrss``, not the largest child so far).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def run_child(name: str, argv: list[str], log: Path, src: Path = ROOT / "src") -> dict:
    """Run ``argv`` with ``src`` first on ``PYTHONPATH`` and one BLAS thread, stderr to
    ``log``; exit with the log's tail if it fails. Returns ``{"step", "wall_s", "peak_gb"}``
    (peak in 10^9 bytes: Linux's ``ru_maxrss`` is in KiB)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(src), env.get("PYTHONPATH")]))
    started = time.perf_counter()
    with open(log, "w") as err:
        proc = subprocess.Popen(argv, env=env, stderr=err, cwd=ROOT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        sys.exit(f"{name} failed ({code}); see {log}:\n{log.read_text()[-3000:]}")
    peak_gb = round(usage.ru_maxrss * 1024 / 1e9, 2)
    return {"step": name, "wall_s": round(wall, 1), "peak_gb": peak_gb}
