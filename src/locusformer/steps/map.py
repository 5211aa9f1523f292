"""``locusformer map``: new data prepared as the model's training data was, then mapped."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pandas as pd

from locusformer.errors import InputError
from locusformer.infer.mapping import MappingResult, align_genes, map_query
from locusformer.io import atomic
from locusformer.model.files import TrainedModel, load_model
from locusformer.steps.outputs import mapping_uns, open_outputs


def prepare_query(
    expression_path: str | os.PathLike,
    samples_path: str | os.PathLike | None,
    batch_key: str,
    model: TrainedModel,
    *,
    value_type: str | None = None,
    layer: str | None = None,
    sample_column: str | None = None,
    label_key: str | None = None,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read and normalize a query as the model's training data were: (log-expression over
    the query's genes, samples x genes; the sample table).

    Counts are scaled to the model's recorded ``target_sum`` over the query's own
    expressed genes and log1p-transformed, as the normalize step did for the reference
    (the library of each dataset is its own). Log-expression is used as it is.
    ``value_type`` defaults to the model's. ``samples_path`` may be None for an ``.h5ad``
    whose ``obs`` holds the columns (see :func:`locusformer.io.expression.read_samples`).
    """
    from locusformer.io.expression import open_expression, read_samples
    from locusformer.pp.normalize import NormalizeParams, plan_normalization, sample_table

    norm = model.record.normalization or {}
    value_type = value_type or norm.get("value_type")
    if value_type is None:
        raise InputError("value_type", "the model records none: say counts or log_expression")
    params = NormalizeParams(
        target_sum=float(norm.get("target_sum", 1e4)), min_samples=1, n_top_genes=0
    )
    with open_expression(expression_path, layer=layer) as source:
        sheet, sheet_path = read_samples(expression_path, samples_path, sample_column)
        obs = sample_table(
            source.obs_names,
            source.var_names,
            sheet,
            batch_key,
            label_key,
            matrix_path=str(expression_path),
            sheet_path=sheet_path,
            min_batches=1,
        )
        plan = plan_normalization(source, obs, value_type, batch_key, params)
        genes = source.var_names[plan.genes]
        values = np.empty((len(obs), len(genes)), dtype=np.float32)
        for rows, normalized, _ in plan.chunks(source):
            values[rows] = normalized
    return pd.DataFrame(values, index=obs.index, columns=genes), obs


def run_map(
    weights_path: str | os.PathLike,
    config_path: str | os.PathLike,
    expression_path: str | os.PathLike,
    samples_path: str | os.PathLike | None,
    batch_key: str,
    corrected_out: str | os.PathLike,
    latent_out: str | os.PathLike,
    h5ad_out: str | os.PathLike | None,
    report_out: str | os.PathLike,
    *,
    value_type: str | None = None,
    layer: str | None = None,
    sample_column: str | None = None,
    label_key: str | None = None,
    reference: str = "mean",
    adapt_epochs: int = 0,
    seed: int = 0,
    device: str = "auto",
    model_name: str | None = None,
) -> MappingResult:
    """Map a query file onto a saved model; write correct's outputs and a JSON report.

    The report says which model (``model_name``, by default the folder of its weights),
    how the genes met (present, filled, ignored), which
    batches were new and whether they were adapted. Everything is checked before the
    first output is written. The query is held in memory (a model's loci x samples).
    """

    model = load_model(weights_path, config_path)
    frame, samples = prepare_query(
        expression_path,
        samples_path,
        batch_key,
        model,
        value_type=value_type,
        layer=layer,
        sample_column=sample_column,
        label_key=label_key,
    )
    X, match = align_genes(frame, model, str(expression_path))
    del frame
    result = map_query(
        model,
        X,
        samples[batch_key].tolist(),
        reference=reference,
        adapt_epochs=adapt_epochs,
        seed=seed,
        device=device,
    )
    genes = pd.Index(model.gene_ids)
    ids = samples.index.astype(str)
    report = {
        "model": {
            "name": model_name or str(Path(weights_path).parent),
            "weights": str(weights_path),
            "config": str(config_path),
        },
        "trained_batches": list(model.batch_names),
        "new_batches": result.new_batches,
        "adapted": result.adapted,
        "adapt_epochs": adapt_epochs,
        "seed": seed,
        "reference": reference,
        "genes": match.to_dict(),
        "samples": len(ids),
        "adaptation_history": result.history,
    }
    with contextlib.ExitStack() as outputs:  # correct's writers, one block of all rows
        writers = open_outputs(
            outputs,
            model,
            samples,
            genes,
            corrected_out=corrected_out,
            latent_out=latent_out,
            h5ad_out=h5ad_out,
            uns=mapping_uns(model, report),
        )
        for write in writers:
            write(slice(0, len(ids)), ids, X, result.corrected, result.latent)
    atomic.write_text(report_out, json.dumps(report, indent=2) + "\n")
    return result
