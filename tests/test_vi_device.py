"""scVI and SysVI train on a GPU when the job has one, and are skipped with a reason where
they would not finish on the CPU or not fit in memory (issue 15)."""

from __future__ import annotations

import pytest

from locusformer.baselines import vi_device


@pytest.fixture
def machine(monkeypatch):
    def set_machine(cuda: bool, room: int | None) -> None:
        monkeypatch.setattr(vi_device, "cuda_available", lambda: cuda)
        monkeypatch.setattr(vi_device, "available_memory", lambda: room)

    return set_machine


def test_a_gpu_is_used_when_the_job_has_one(machine) -> None:
    machine(cuda=True, room=64 * 2**30)
    assert vi_device.vi_accelerator("scVI", 1_000_000, 2_000) == "gpu"
    assert vi_device.vi_accelerator("SysVI", 1_000_000, 2_000) == "gpu"


def test_without_a_gpu_small_data_train_on_the_cpu(machine) -> None:
    machine(cuda=False, room=None)  # memory unknown: not a reason to skip
    assert vi_device.vi_accelerator("scVI", 450, 2_000) == "cpu"
    assert vi_device.vi_accelerator("SysVI", vi_device.SYSVI_CPU_MAX_SAMPLES, 2_000) == "cpu"


def test_sysvi_on_the_cpu_above_its_limit_is_skipped_with_the_reason(machine) -> None:
    machine(cuda=False, room=64 * 2**30)
    with pytest.raises(RuntimeError, match=r"SysVI skipped: 50,001 samples and no GPU"):
        vi_device.vi_accelerator("SysVI", vi_device.SYSVI_CPU_MAX_SAMPLES + 1, 2_000)


def test_scvi_is_skipped_when_its_dense_counts_do_not_fit(machine) -> None:
    # 1M x 2,000 float32 counts, twice: 14.9 GiB, against 12 GiB available
    machine(cuda=True, room=12 * 2**30)
    with pytest.raises(RuntimeError, match=r"scVI skipped: .*14\.9 GiB.*12\.0 GiB are available"):
        vi_device.vi_accelerator("scVI", 1_000_000, 2_000)
    machine(cuda=False, room=16 * 2**30)  # they fit: scVI's time follows steps, it runs
    assert vi_device.vi_accelerator("scVI", 1_000_000, 2_000) == "cpu"
