"""Where the scvi-tools baselines (scVI, SysVI) train, and when they are skipped instead.

On a job with a CUDA device they train on it. On the CPU, a run that would not finish in a
workflow's time, or would not fit in memory, is skipped with the reason, which the baseline
records as a failed result (the report shows it) rather than running for hours.
"""

from __future__ import annotations

from typing import Literal

from locusformer.io.memory import available_memory

#: SysVI trains a fixed 200 epochs, so its time grows with the samples: 74 s for 1,021
#: samples on 2 CPU cores (issue 18), about 2 h at 100,000
SYSVI_CPU_MAX_SAMPLES: int = 50_000
#: dense float32 copies of the count matrix scVI's setup holds at once (the table read from
#: counts.parquet and the array given to scvi-tools)
SCVI_COUNT_COPIES: int = 2


def cuda_available() -> bool:
    """Whether this job sees a CUDA device (torch is imported only here, when asked)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def vi_accelerator(
    method: Literal["scVI", "SysVI"], n_obs: int, n_vars: int
) -> Literal["gpu", "cpu"]:
    """The Lightning accelerator ``method`` trains on; :class:`RuntimeError` to skip it.

    scVI is skipped when its dense count copies would not fit in the memory left (its
    default training length follows optimizer steps, so time alone does not rule it out);
    SysVI on the CPU above :data:`SYSVI_CPU_MAX_SAMPLES` samples.
    """
    room = available_memory()
    need = SCVI_COUNT_COPIES * n_obs * n_vars * 4
    if method == "scVI" and room is not None and need > room:
        raise RuntimeError(
            f"scVI skipped: its dense counts need {need / 2**30:.1f} GiB "
            f"({n_obs:,} samples x {n_vars:,} genes, {SCVI_COUNT_COPIES} copies) and "
            f"{room / 2**30:.1f} GiB are available"
        )
    if cuda_available():
        return "gpu"
    if method == "SysVI" and n_obs > SYSVI_CPU_MAX_SAMPLES:
        raise RuntimeError(
            f"SysVI skipped: {n_obs:,} samples and no GPU (its 200 epochs on the CPU take "
            f"hours above {SYSVI_CPU_MAX_SAMPLES:,}); run the baseline rule on a GPU node"
        )
    return "cpu"
