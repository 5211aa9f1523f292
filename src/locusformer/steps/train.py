"""File-level steps for the CLI: read the workflow's files, call the library, write.

Training's step is here; correction's and mapping's live beside their libraries
(:func:`locusformer.infer.correct.run_correct`, :func:`locusformer.infer.mapping.run_map`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from locusformer.errors import InputError
from locusformer.io import atomic
from locusformer.io.samples import read_batches, read_loci
from locusformer.model.config import split_params
from locusformer.model.files import TrainedModel, read_normalization, save_model
from locusformer.pp.batches import refuse_protected_batch
from locusformer.train.alignment import covariate_levels
from locusformer.train.data import ordered_matrix
from locusformer.train.loop import train_corrector


def run_train(
    ordered_path: str | os.PathLike,
    loci_path: str | os.PathLike,
    samples_path: str | os.PathLike,
    batch_key: str,
    params: Mapping[str, Any] | None,
    weights_out: str | os.PathLike,
    config_out: str | os.PathLike,
    history_out: str | os.PathLike,
    checkpoint_path: str | os.PathLike | None,
    seed: int,
    device: str = "auto",
    *,
    progress: bool = True,
    protect: Sequence[str] = (),
    normalize_stats: str | os.PathLike | None = None,
) -> TrainedModel:
    """Train from the preprocessing outputs and write weights, config and history TSV.

    ``params`` has optional sub-dicts "model" and "train" of config overrides.
    ``normalize_stats``, the normalize step's JSON, is recorded so that
    :func:`locusformer.infer.mapping.run_map` prepares new data the same way. ``protect`` names
    sample-sheet columns of biology to keep (batch is removed within
    their levels; see :mod:`locusformer.train.alignment`); they are recorded in the model. The
    mean attention map of the saved model is :func:`locusformer.infer.correct.run_attention`'s.
    """
    refuse_protected_batch(protect, batch_key)
    model_config, train_config = split_params(params)
    train_config.validate()
    scratch = Path(checkpoint_path if checkpoint_path is not None else weights_out).parent
    with ordered_matrix(ordered_path, train_config.data_on_disk, scratch) as ordered:
        X, sample_ids, columns = ordered
        loci = read_loci(loci_path)
        genes = loci["gene_id"].astype(str).tolist()
        if genes != columns:
            raise InputError(loci_path, f"gene ids do not match the columns of {ordered_path}")
        table = read_batches(samples_path, batch_key, sample_ids)
        batches = table[batch_key].tolist()
        levels = covariate_levels(table, list(protect), str(samples_path)) if protect else None
        model, history = train_corrector(
            X,
            batches,
            loci,
            model_config,
            train_config,
            seed=seed,
            device=device,
            checkpoint_path=checkpoint_path,
            progress=progress,
            covariates=levels,
            source=str(ordered_path),
        )
        model.record.protect = list(protect)
        model.record.normalization = read_normalization(normalize_stats)
        if train_config.devices > 1 and int(os.environ.get("RANK", "0")) != 0:
            return model  # one process per device; the first writes the outputs
        save_model(model, weights_out, config_out)
        with atomic.atomic_path(history_out) as tmp:
            history.to_csv(tmp, sep="\t", index=False)
    return model
