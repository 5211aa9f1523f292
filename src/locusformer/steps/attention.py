"""``locusformer attention``: the mean attention map of a trained model, for the report."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from locusformer.errors import InputError
from locusformer.infer.correct import attention_map, batch_codes, round_robin
from locusformer.io import atomic
from locusformer.io.parquet import iter_matrix_parquet
from locusformer.io.samples import read_batches, read_loci
from locusformer.model.files import TrainedModel, load_model
from locusformer.model.network import CHROMOSOMES
from locusformer.steps.outputs import matching_ids
from locusformer.train.runtime import resolve_device


def write_attention(
    model: TrainedModel,
    X: np.ndarray,
    batch_labels: Sequence[Any],
    path: str | os.PathLike,
    max_samples: int = 256,
) -> None:
    """Save the mean attention map and the token layout as an .npz, atomically.

    Arrays: ``attention`` (layers, heads, T, T) float32, ``token_chrom`` (T,) chromosome
    names ("unplaced" for the rest), ``token_position`` (T,) the encoded positions,
    ``token_genes`` (T, P) the gene ids in each token ("" in padding slots) and
    ``model_config`` (a JSON string: the architecture, for the report's diagram).
    """
    attn = attention_map(model, X, batch_labels, max_samples=max_samples)
    codes = model.module.embed.token_chrom.cpu().tolist()
    names = np.array([CHROMOSOMES[c] if c < len(CHROMOSOMES) else "unplaced" for c in codes])
    genes = np.array([*(model.gene_ids or [f"locus {i}" for i in range(model.n_loci)]), ""])
    slots = model.module.embed.token_index.cpu().numpy()  # n_loci marks a padding slot
    with atomic.atomic_path(path) as tmp, open(tmp, "wb") as fh:
        np.savez_compressed(
            fh,
            attention=attn,
            token_chrom=names,
            token_position=model.module.embed.token_position.cpu().numpy(),
            token_genes=genes[slots],
            model_config=np.array(json.dumps(model.config.to_dict())),
        )


def run_attention(
    ordered_path: str | os.PathLike,
    loci_path: str | os.PathLike | None,
    samples_path: str | os.PathLike,
    batch_key: str,
    weights_path: str | os.PathLike,
    config_path: str | os.PathLike,
    attention_out: str | os.PathLike,
    device: str = "auto",
    max_samples: int = 256,
) -> None:
    """Write the mean attention map of a saved model (see :func:`write_attention`).

    ``loci_path``, when given, is only checked against the model's genes.
    """
    model = load_model(weights_path, config_path).to(resolve_device(device))
    sample_ids, _ = matching_ids(ordered_path, model)
    if loci_path is not None:
        loci = read_loci(loci_path)
        if loci["gene_id"].astype(str).tolist() != model.gene_ids:
            raise InputError(loci_path, f"gene ids do not match the model in {weights_path}")
    batches = read_batches(samples_path, batch_key, sample_ids)[batch_key].tolist()
    # Only the samples the map is averaged over are read, block by block.
    chosen = np.sort(round_robin(batch_codes(model, batches))[:max_samples])
    X = np.empty((len(chosen), model.n_loci), dtype=np.float32)
    done = 0
    for block in iter_matrix_parquet(ordered_path, "ordered matrix"):
        lo, hi = np.searchsorted(chosen, [done, done + len(block)])
        X[lo:hi] = block.to_numpy()[chosen[lo:hi] - done]
        done += len(block)
    labels = [batches[i] for i in chosen]
    write_attention(model, X, labels, attention_out, max_samples=len(chosen))
