"""Untrusted model files, and the machine saying no: a full disk, a path that cannot be
written, a matrix larger than the memory left. Each ends in one line naming the path."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import torch
from robustness_cli import (
    GENES,
    SAMPLES,
    assert_refused,
    counts_frame,
    files_under,
    normalize,
    order_loci,
    run_cli,
    sheet_frame,
)

import locusformer.io.atomic
import locusformer.io.expression

TINY = {
    "model": {"patch_size": 2, "d_model": 8, "n_heads": 2, "n_layers": 1, "latent_dim": 4},
    "train": {"max_epochs": 2, "batch_size": 4},
}


class Payload:
    """Unpickling this calls ``os.mkdir(marker)``: code that a model file must not run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    """normalize -> order-loci -> train through the CLI, on the tiny counts."""
    root = tmp_path_factory.mktemp("model")
    counts_frame().to_csv(root / "m.csv")
    sheet_frame().to_csv(root / "s.csv", index=False)
    assert normalize(root / "m.csv", root / "s.csv", root)[0] == 0
    genes = root / "genes.tsv"
    pd.DataFrame(
        {"ensembl_id": GENES, "chrom": "chr2", "start": range(100, 900, 100), "end": 1000}
    ).to_csv(genes, sep="\t", index=False)
    assert order_loci(root / "normalized.parquet", genes, root, "ensembl_id")[0] == 0
    torch.set_num_threads(1)
    code, lines = _train(root, root / "model")
    assert code == 0, lines
    return root


def _train(root: Path, out: Path, checkpoint: Path | None = None):
    return run_cli(
        [
            "train",
            "--matrix", root / "ordered.parquet",
            "--loci", root / "loci.parquet",
            "--samples", root / "samples.tsv",
            "--batch-key", "batch",
            "--params", json.dumps(TINY),
            "--device", "cpu",
            *(["--checkpoint", checkpoint] if checkpoint else []),
            "--out-weights", out / "model.pt",
            "--out-config", out / "model.json",
            "--out-history", out / "history.tsv",
        ]
    )  # fmt: skip


def _evil_copy(weights: Path, marker: Path, to: Path) -> Path:
    payload = torch.load(weights, weights_only=True)
    payload["batch_names"] = Payload(marker)
    torch.save(payload, to)
    return to


def test_a_model_file_carrying_code_is_refused_and_the_code_never_runs(prepared, tmp_path):
    marker = tmp_path / "code-ran"
    evil = _evil_copy(prepared / "model" / "model.pt", marker, tmp_path / "evil.pt")
    out = tmp_path / "out"
    correct = [
        "correct",
        "--matrix", prepared / "ordered.parquet",
        "--samples", prepared / "samples.tsv",
        "--batch-key", "batch",
        "--weights", evil,
        "--config", prepared / "model" / "model.json",
        "--device", "cpu",
        "--out-corrected", out / "corrected.parquet",
        "--out-latent", out / "latent.parquet",
        "--out-h5ad", out / "locusformer.h5ad",
    ]  # fmt: skip
    assert_refused(run_cli(correct), out, "evil.pt", "refused to load", "could run code")
    attention = [
        "attention",
        "--matrix", prepared / "ordered.parquet",
        "--loci", prepared / "loci.parquet",
        "--samples", prepared / "samples.tsv",
        "--batch-key", "batch",
        "--weights", evil,
        "--config", prepared / "model" / "model.json",
        "--device", "cpu",
        "--out", out / "attention.npz",
    ]  # fmt: skip
    assert_refused(run_cli(attention), out, "evil.pt", "refused to load")
    assert not marker.exists(), "the payload ran"
    # The genuine file, given the same way, works.
    correct[correct.index("--weights") + 1] = prepared / "model" / "model.pt"
    assert run_cli(correct)[0] == 0


def test_a_checkpoint_carrying_code_is_ignored_and_training_starts_fresh(prepared, tmp_path):
    marker = tmp_path / "code-ran"
    checkpoint = _evil_copy(prepared / "model" / "model.pt", marker, tmp_path / "ckpt.pt")
    with pytest.warns(UserWarning, match="unreadable checkpoint"):
        code, lines = _train(prepared, tmp_path / "model", checkpoint)
    assert code == 0, lines
    assert not marker.exists(), "the payload ran"
    history = pd.read_csv(tmp_path / "model" / "history.tsv", sep="\t")
    assert len(history) == TINY["train"]["max_epochs"]


@pytest.mark.parametrize(
    "foreign",
    [[1, 2, 3], {"format": 2, "epoch": 3}, {"epoch": 1, "history": "not a list"}],
    ids=["a list", "a dict without history", "a dict of the wrong things"],
)
def test_a_checkpoint_that_is_not_ours_is_set_aside_whatever_it_holds(prepared, tmp_path, foreign):
    checkpoint = tmp_path / "ckpt.pt"
    torch.save(foreign, checkpoint)
    with pytest.warns(UserWarning, match="not a LocusFormer checkpoint"):
        code, lines = _train(prepared, tmp_path / "model", checkpoint)
    assert code == 0, lines
    history = pd.read_csv(tmp_path / "model" / "history.tsv", sep="\t")
    assert len(history) == TINY["train"]["max_epochs"]


def test_two_identical_trainings_write_byte_identical_model_files(prepared, tmp_path):
    # A checksum identifies a model: the weights file holds no random temporary name.
    assert _train(prepared, tmp_path / "again")[0] == 0
    first = (prepared / "model" / "model.pt").read_bytes()
    assert (tmp_path / "again" / "model.pt").read_bytes() == first


def _correct_with(prepared: Path, config: Path, out: Path) -> tuple[int, list[str]]:
    return run_cli(
        [
            "correct",
            "--matrix", prepared / "ordered.parquet",
            "--samples", prepared / "samples.tsv",
            "--batch-key", "batch",
            "--weights", prepared / "model" / "model.pt",
            "--config", config,
            "--device", "cpu",
            "--out-corrected", out / "corrected.parquet",
            "--out-latent", out / "latent.parquet",
            "--out-h5ad", out / "locusformer.h5ad",
        ]
    )  # fmt: skip


@pytest.mark.parametrize(
    ("change", "fragments"),
    [
        ({"locusformer_version": "9.9.9"}, ["written by locusformer 9.9.9", "upgrade"]),
        ({"locusformer_version": "latest"}, ["'latest' is not a version"]),
        ({"n_loci": 300}, ["says 300 loci", "not of one model"]),
    ],
    ids=["newer release", "not a version", "locus count"],
)
def test_a_model_json_that_does_not_match_its_weights_is_refused(
    prepared, tmp_path, change, fragments
):
    config = json.loads((prepared / "model" / "model.json").read_text())
    (tmp_path / "model.json").write_text(json.dumps({**config, **change}))
    out = tmp_path / "out"
    assert_refused(_correct_with(prepared, tmp_path / "model.json", out), out, *fragments)


# -- the machine says no ----------------------------------------------------------------------


def _inputs(tmp_path: Path) -> tuple[Path, Path]:
    counts_frame().to_csv(tmp_path / "m.csv.gz")
    sheet_frame().to_csv(tmp_path / "s.csv", index=False)
    return tmp_path / "m.csv.gz", tmp_path / "s.csv"


def test_an_output_path_that_cannot_be_created_is_named(tmp_path):
    matrix, sheet = _inputs(tmp_path)
    (tmp_path / "results").write_text("a file where a directory should be")
    out = tmp_path / "results" / "demo"
    line = assert_refused(normalize(matrix, sheet, out), tmp_path / "nothing", code=1)
    assert str(out / "normalized.parquet") in line and "cannot write" in line


def test_a_full_disk_names_the_output_and_leaves_no_partial_file(tmp_path, monkeypatch):
    matrix, sheet = _inputs(tmp_path)
    replace = os.replace

    def full(src, dst):
        if str(dst).endswith("samples.tsv"):  # the third output: two are already written
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(src))
        replace(src, dst)

    monkeypatch.setattr(locusformer.io.atomic.os, "replace", full)
    out = tmp_path / "out"
    code, lines = normalize(matrix, sheet, out)
    assert code == 1 and len(lines) == 1, lines
    assert f"{out / 'samples.tsv'}: cannot write: No space left on device" in lines[0]
    assert not [f for f in files_under(out) if f.endswith(".tmp") or f == "samples.tsv"]


@pytest.mark.parametrize(
    ("target", "error"),
    [
        ("ckpt.pt", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
        ("model.pt", OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))),
        # What torch's zip writer raises when the disk fills up under it.
        (
            "model.pt",
            RuntimeError(
                "[enforce fail at inline_container.cc:778] . PytorchStreamWriter failed "
                "writing file data/3: file write failed"
            ),
        ),
    ],
)
def test_a_full_disk_under_torch_save_names_the_output(
    prepared, tmp_path, monkeypatch, target, error
):
    save = torch.save

    def full(payload, file, *args, **kwargs):
        name = Path(getattr(file, "name", file)).name  # a path, or the file opened on it
        if name.startswith(f".{target}."):
            file.write(b"PK\x03\x04 half a zip")  # torch has begun writing
            raise error
        save(payload, file, *args, **kwargs)

    monkeypatch.setattr(torch, "save", full)
    out = tmp_path / "out"
    code, lines = _train(prepared, out, out / "ckpt.pt")
    lines = [line for line in lines if line.strip() and not line.startswith("train:")]  # tqdm
    assert code == 1 and len(lines) == 1, lines
    reason = "No space left on device" if isinstance(error, OSError) else "file write failed"
    assert f"{out / target}: cannot write: " in lines[0] and reason in lines[0], lines[0]
    assert "enforce fail" not in lines[0]
    left = files_under(out)
    assert target not in left and not [f for f in left if f.endswith(".tmp")], left
    assert "model.json" not in left and "history.tsv" not in left


def test_a_write_error_names_the_output_not_the_temporary_file(tmp_path):
    from locusformer.io.atomic import WriteError, atomic_path

    target = tmp_path / "out.txt"
    with pytest.raises(WriteError) as info, atomic_path(target) as tmp:
        raise OSError(errno.EACCES, "Permission denied", str(tmp))
    assert info.value.filename == str(target) and "Permission denied" in info.value.strerror
    assert files_under(tmp_path) == []


@pytest.mark.parametrize("kind", ["csv.gz", "parquet", "h5ad"])
def test_a_matrix_larger_than_the_memory_left_is_refused_before_reading(
    tmp_path, monkeypatch, kind
):
    frame = counts_frame()
    matrix = tmp_path / f"m.{kind}"
    if kind == "csv.gz":
        frame.to_csv(matrix)
    elif kind == "parquet":
        frame.to_parquet(matrix)
    else:
        ad.AnnData(
            X=frame.T.to_numpy(dtype=np.float32),
            obs=pd.DataFrame(index=SAMPLES),
            var=pd.DataFrame(index=GENES),
        ).write_h5ad(matrix)
    sheet = tmp_path / "s.csv"
    sheet_frame().to_csv(sheet, index=False)
    monkeypatch.setattr(locusformer.io.expression, "available_memory", lambda: 100)
    read = []
    monkeypatch.setattr(locusformer.io.expression, "read_table", lambda *a, **k: read.append(a))
    out = tmp_path / "out"
    line = assert_refused(normalize(matrix, sheet, out), out, f"m.{kind}", "of memory")
    assert "needs at least" in line and "mem_mb" in line
    if kind != "h5ad":
        assert "8 x 8 values" in line
    assert read == [], "refused before reading"


def test_the_memory_estimate_of_a_text_matrix_counts_its_lines(tmp_path, monkeypatch):
    matrix, _ = _inputs(tmp_path)
    monkeypatch.setattr(locusformer.io.expression, "available_memory", lambda: 100)
    need, shape = locusformer.io.expression.estimate_matrix_memory(matrix)
    assert shape == "8 x 8 values" and need == 64 * locusformer.io.expression.BYTES_PER_VALUE
    # With room to spare, a small plain file is not even scanned.
    monkeypatch.setattr(locusformer.io.expression, "available_memory", lambda: 2**40)
    counts_frame().to_csv(tmp_path / "m.csv")
    assert locusformer.io.expression.estimate_matrix_memory(tmp_path / "m.csv") is None
