"""Applying a trained model (:class:`~locusformer.checkpoint.TrainedModel`), and the
file-level steps.

``correct`` decodes every sample as if it came from the reference batch (a named batch,
or "mean": the average of all batch conditionings). It streams in chunks under
``torch.inference_mode`` so memory beyond the output does not grow with the number of
samples.
"""

from __future__ import annotations

import collections
import contextlib
import ctypes
import json
import os
import sys
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from locusformer import atomic
from locusformer.checkpoint import TrainedModel, load_model
from locusformer.data import as_matrix, read_batches
from locusformer.errors import InputError
from locusformer.model import CHROMOSOMES
from locusformer.parquet import (
    iter_matrix_parquet,
    matrix_parquet_writer,
    open_matrix_parquet,
    rows_per_chunk,
)
from locusformer.runtime import autocast, resolve_device


def batch_codes(model: TrainedModel, batch_labels: Sequence[Any]) -> np.ndarray:
    """Batch names -> codes of the model; a batch not seen in training is an InputError."""
    index = {name: i for i, name in enumerate(model.batch_names)}
    labels = [str(b) for b in batch_labels]
    unknown = sorted(set(labels) - set(index))
    if unknown:
        shown = ", ".join(map(repr, unknown[:5])) + (" ..." if len(unknown) > 5 else "")
        raise InputError(
            "batch labels",
            f"batch(es) not seen in training: {shown} (known: {', '.join(model.batch_names)})",
        )
    return np.array([index[b] for b in labels], dtype=np.int64)


def reference_code(model: TrainedModel, reference: str) -> int | None:
    """The network's code of batch ``reference``, None for "mean"; InputError otherwise."""
    if reference == "mean":
        return None
    if reference not in model.batch_names:
        valid = ", ".join(["mean", *model.batch_names])
        raise InputError("reference", f"unknown batch {reference!r} (valid: {valid})")
    return model.batch_names.index(reference)


def _prepare(
    model: TrainedModel, X: Any, batch_labels: Sequence[Any]
) -> tuple[np.ndarray, np.ndarray]:
    X = as_matrix(X)
    if X.shape[1] != model.n_loci:
        raise InputError(
            "expression matrix", f"has {X.shape[1]} loci, the model was trained on {model.n_loci}"
        )
    if len(batch_labels) != X.shape[0]:
        raise InputError("batch labels", f"{len(batch_labels)} labels for {X.shape[0]} samples")
    return X, batch_codes(model, batch_labels)


#: Values per block of rows that run_correct reads, corrects and writes (16 MiB).
BLOCK_VALUES = 1 << 22

#: Samples per chunk of the model's forward pass. Small enough that a chunk's activations
#: (the feed-forward layer's are chunk x tokens x 256 floats) stay in the heap and in cache:
#: on CPU, 64 (4.9 MB of them) ran the model as fast as 128 and 1.1x as fast as 256, and
#: correct at 100k held 70 MB less than with 128 (BENCHMARKS.md, "Scaling").
CHUNK_SIZE = 64


def iter_correct(
    model: TrainedModel,
    X: np.ndarray | pd.DataFrame,
    batch_labels: Sequence[Any],
    *,
    reference: str = "mean",
    add_residual: bool = False,
    chunk_size: int = CHUNK_SIZE,
    device: str | torch.device = "auto",
    workers: int | None = None,
) -> Iterator[tuple[slice, np.ndarray, np.ndarray]]:
    """Yield (rows, corrected (k, L) float32, latent (k, Z) float32) chunk by chunk.

    ``add_residual`` adds back what the model could not reconstruct of each sample,
    x - decode(z, own batch); it keeps sample-specific detail but also any batch effect
    the decoder did not capture (off by default).

    On CPU, chunks run side by side on ``workers`` threads (default: torch's thread
    count), each op single-threaded: the model's ops are small (width 64), and splitting
    each of them over threads spent more time synchronizing than computing (measured
    0.17 of ``torch.mm``'s rate at 2 threads, against 0.55 with one chunk per thread). The
    chunks are yielded in order and give the same numbers either way.
    """
    X, codes = _prepare(model, X, batch_labels)
    ref_code = reference_code(model, reference)
    if chunk_size < 1:
        raise InputError("chunk_size", f"must be >= 1, got {chunk_size}")
    dev = resolve_device(device)
    net = model.module
    was_training = net.training
    net.eval().to(dev)

    def run(rows: slice) -> tuple[slice, np.ndarray, np.ndarray]:
        # inference_mode and autocast are per thread: entered here, in the worker.
        with torch.inference_mode():
            x = torch.from_numpy(X[rows]).to(dev)  # (k, L) raw log-expression
            b = torch.from_numpy(codes[rows]).to(dev)  # (k,)
            xs = net.standardize(x)
            with autocast(dev):
                z, _ = net.encode(xs)  # (k, Z)
                ref = net.reference_condition(ref_code, len(x), dev)
                out = net.decode(z, ref).float()  # (k, L) standardized
                if add_residual:
                    out = out + (xs - net.decode(z, net.condition(b)).float())
            corrected = net.unstandardize(out.float())  # un-standardize in fp32
            return rows, corrected.cpu().numpy(), z.float().cpu().numpy()

    chunks = [slice(a, min(a + chunk_size, len(X))) for a in range(0, len(X), chunk_size)]
    n_workers = workers if workers is not None else torch.get_num_threads()
    n_workers = 1 if dev.type != "cpu" else max(1, min(n_workers, len(chunks)))
    try:
        if n_workers == 1:
            yield from map(run, chunks)
        else:
            with _one_thread_per_op(), ThreadPoolExecutor(n_workers) as pool:
                pending: collections.deque = collections.deque()
                for rows in chunks:
                    pending.append(pool.submit(run, rows))
                    if len(pending) > 2 * n_workers:  # a few chunks ahead, not all of X
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()
    finally:
        net.train(was_training)


@contextlib.contextmanager
def _one_thread_per_op() -> Iterator[None]:
    """torch's intra-op threads set to 1 for the block (new threads take that), restored."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def correct(
    model: TrainedModel,
    X: np.ndarray | pd.DataFrame,
    batch_labels: Sequence[Any],
    *,
    reference: str = "mean",
    add_residual: bool = False,
    chunk_size: int = CHUNK_SIZE,
    device: str | torch.device = "auto",
) -> tuple[np.ndarray, np.ndarray]:
    """Batch-corrected log-expression (n, L) and latent (n, Z), both float32.

    Parameters
    ----------
    X
        Samples x loci log-expression, columns in the order the model was trained on.
    batch_labels
        Batch of each sample; every batch must have been seen in training.
    reference
        A batch name, or "mean" (the average of all batch conditionings).
    """
    X = as_matrix(X)
    corrected = np.empty(X.shape, dtype=np.float32)
    latent = np.empty((X.shape[0], model.config.latent_dim), dtype=np.float32)
    chunks = iter_correct(
        model,
        X,
        batch_labels,
        reference=reference,
        add_residual=add_residual,
        chunk_size=chunk_size,
        device=device,
    )
    for rows, c, z in chunks:
        corrected[rows] = c
        latent[rows] = z
    return corrected, latent


def attention_map(
    model: TrainedModel,
    X: np.ndarray | pd.DataFrame,
    batch_labels: Sequence[Any],
    max_samples: int = 256,
) -> np.ndarray:
    """Mean attention weights over samples, (n_layers, n_heads, T, T) float32.

    Uses the explicit attention path on CPU-sized chunks. At most ``max_samples`` samples
    are used, taken round-robin across batches so every batch is represented.
    """
    X, codes = _prepare(model, X, batch_labels)
    order = _round_robin(codes)[:max_samples]
    T, H = model.n_tokens, model.config.n_heads
    total = torch.zeros(model.config.n_layers, H, T, T, dtype=torch.float64)
    # Keep one chunk's weights (k x layers x H x T x T floats) near 256 MB.
    per_sample = model.config.n_layers * H * T * T * 4
    chunk = max(1, int(2**28 // per_sample))
    net = model.module
    dev = next(net.parameters()).device
    was_training = net.training
    net.eval()
    try:
        with torch.inference_mode():
            for start in range(0, len(order), chunk):
                rows = order[start : start + chunk]
                x = net.standardize(torch.from_numpy(X[rows]).to(dev))
                _, weights = net.encode(x, need_weights=True)
                total += torch.stack([w.sum(dim=0) for w in weights]).double().cpu()
    finally:
        net.train(was_training)
    return (total / max(1, len(order))).float().numpy()


def _round_robin(codes: np.ndarray) -> np.ndarray:
    """Sample indices interleaved across batches: b0[0], b1[0], ..., b0[1], b1[1], ..."""
    groups = [np.flatnonzero(codes == b) for b in np.unique(codes)]
    rank = np.concatenate([np.arange(len(g)) for g in groups])
    idx = np.concatenate(groups)
    return idx[np.lexsort((codes[idx], rank))]


# --------------------------------------------------------------------------------------
# File-level steps for the CLI (training's is train.run_train)
# --------------------------------------------------------------------------------------


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
    sample_ids, _ = _matching_ids(ordered_path, model)
    if loci_path is not None:
        loci = pd.read_parquet(loci_path, engine="pyarrow")
        if loci.get("gene_id", pd.Series(dtype=str)).astype(str).tolist() != model.gene_ids:
            raise InputError(loci_path, f"gene ids do not match the model in {weights_path}")
    batches = read_batches(samples_path, batch_key, sample_ids)[batch_key].tolist()
    # Only the samples the map is averaged over are read, block by block.
    chosen = np.sort(_round_robin(batch_codes(model, batches))[:max_samples])
    X = np.empty((len(chosen), model.n_loci), dtype=np.float32)
    done = 0
    for block in iter_matrix_parquet(ordered_path, "ordered matrix"):
        lo, hi = np.searchsorted(chosen, [done, done + len(block)])
        X[lo:hi] = block.to_numpy()[chosen[lo:hi] - done]
        done += len(block)
    labels = [batches[i] for i in chosen]
    write_attention(model, X, labels, attention_out, max_samples=len(chosen))


def _matching_ids(
    ordered_path: str | os.PathLike, model: TrainedModel
) -> tuple[pd.Index, pd.Index]:
    """Sample ids and gene columns of ordered.parquet, the genes checked to be the model's.

    Reads the ids and the schema only, not the values.
    """
    handle, genes = open_matrix_parquet(ordered_path, "ordered matrix")
    try:
        if model.gene_ids is not None and genes != model.gene_ids:
            raise InputError(
                ordered_path,
                f"gene columns differ from the {model.n_loci} loci the model was trained on "
                "(same genes in the same order required)",
            )
        column = handle.read(columns=["sample_id"]).column("sample_id")
    finally:
        handle.close()  # its footer (0.1 GB at 1M samples) goes before the ids come
    # Without arrow's de-duplication of the strings: ids are unique, and its hash table
    # stayed as heap that the process kept (0.15 GB at 1M samples, measured).
    ids = column.to_pandas(deduplicate_objects=False)
    return pd.Index(ids.astype(str), name="sample_id"), pd.Index(genes)


def run_correct(
    ordered_path: str | os.PathLike,
    samples_path: str | os.PathLike,
    batch_key: str,
    weights_path: str | os.PathLike,
    config_path: str | os.PathLike,
    corrected_out: str | os.PathLike,
    latent_out: str | os.PathLike,
    h5ad_out: str | os.PathLike | None,
    reference: str = "mean",
    add_residual: bool = False,
    chunk_size: int = CHUNK_SIZE,
    device: str = "auto",
) -> None:
    """Correct ``ordered_path`` with a saved model; write parquet outputs and an .h5ad.

    corrected.parquet has the input's sample index and gene columns (float32);
    latent.parquet has columns latent_0..latent_{d-1}; the .h5ad holds X = input,
    layers["corrected"], obsm["X_locusformer"] = latent, obs = sample table, var = loci.

    The input is read in blocks of rows and every output written block by block, so
    memory holds three blocks (one read ahead, one corrected, one being written), a batch
    code per sample and the parquet writers' footers
    (see :data:`locusformer.parquet.ROW_GROUP_BYTES`), whatever the number of samples.
    """
    _fewer_malloc_arenas()  # before any of its threads start
    model = load_model(weights_path, config_path)
    reference_code(model, reference)  # refused before anything is read
    if chunk_size < 1:
        raise InputError("chunk_size", f"must be >= 1, got {chunk_size}")
    sample_ids, genes = _matching_ids(ordered_path, model)
    samples = read_batches(samples_path, batch_key, sample_ids)
    # Codes, not the names: 8 bytes a sample. An unknown batch is refused here, before
    # anything is written.
    codes = batch_codes(model, samples[batch_key])
    names = np.asarray(model.batch_names, dtype=object)
    with contextlib.ExitStack() as outputs, ThreadPoolExecutor(1) as writing:
        writers = _open_outputs(outputs, model, samples, genes, corrected_out, latent_out, h5ad_out)
        # The sample table and ids went into the .h5ad's obs; blocks bring their own ids.
        # Kept, their strings would hold memory in proportion to the samples through the loop.
        del samples, sample_ids

        def write_all(rows: slice, *arrays: Any) -> None:
            for write in writers:
                write(rows, *arrays)

        # Reading (one thread), the model (its workers) and writing (one thread) overlap,
        # one block each: on CPU, decompressing, compressing and copying into the .h5ad
        # took more than half of correct's time run between the model's blocks.
        written = None
        done = 0
        step = rows_per_chunk(model.n_loci, BLOCK_VALUES)
        for ids, X in _read_ahead(iter_matrix_parquet(ordered_path, "ordered matrix", rows=step)):
            rows = slice(done, done + len(X))
            corrected, latent = correct(
                model,
                X,
                names[codes[rows]],
                reference=reference,
                add_residual=add_residual,
                chunk_size=chunk_size,
                device=device,
            )
            if written is not None:
                written.result()  # the previous block's; raises what the writer raised
            written = writing.submit(write_all, rows, ids, X, corrected, latent)
            done = rows.stop
            del X, corrected, latent  # the writer holds them until written
        if written is not None:
            written.result()


def _fewer_malloc_arenas(arenas: int = 2) -> None:
    """Cap glibc's malloc arenas for the rest of the process (no-op elsewhere).

    glibc gives threads that allocate at once arenas of their own (up to 8 per core), and
    memory freed in one is not reused by another: with correct's reader, writer and model
    threads, 2 arenas instead of glibc's default held 64 MB less at 100k samples, at the
    same speed (measured with MALLOC_ARENA_MAX=2).
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None).mallopt(-8, arenas)  # -8: M_ARENA_MAX
    except (OSError, AttributeError):  # not glibc
        pass


def _read_ahead(
    blocks: Generator[pd.DataFrame, None, None],
) -> Iterator[tuple[pd.Index, np.ndarray]]:
    """(ids, rows as a C-contiguous float32 copy) of each block, the next read by a thread.

    The copy is made in the thread (rows in a row, as h5py writes them and the model
    reads them), so that no view of the reader's row group outlives the block: the next
    group then takes the place of this one instead of coming beside it.
    """

    def next_copy() -> tuple[pd.Index, np.ndarray] | None:
        block = next(blocks, None)
        return None if block is None else (block.index, np.ascontiguousarray(block.to_numpy()))

    try:
        with ThreadPoolExecutor(1) as reading:
            pending = reading.submit(next_copy)
            while (item := pending.result()) is not None:
                pending = reading.submit(next_copy)
                yield item
    finally:
        blocks.close()  # after the pool's exit: no read is in flight


def _open_outputs(
    outputs: contextlib.ExitStack,
    model: TrainedModel,
    samples: pd.DataFrame,
    genes: pd.Index,
    corrected_out: str | os.PathLike,
    latent_out: str | os.PathLike,
    h5ad_out: str | os.PathLike | None,
    uns: dict[str, Any] | None = None,
) -> list[Callable[..., None]]:
    """Writers of correct's outputs, each ``write(rows, ids, X, corrected, latent)``.

    ``uns`` is the .h5ad's ``uns["locusformer"]``; by default, :func:`model_uns`.
    """
    latent_cols = pd.Index([f"latent_{i}" for i in range(model.config.latent_dim)])
    corrected = outputs.enter_context(matrix_parquet_writer(corrected_out, genes))
    latent = outputs.enter_context(matrix_parquet_writer(latent_out, latent_cols))
    writers = [
        lambda rows, ids, X, c, z: corrected(c, ids),
        lambda rows, ids, X, c, z: latent(z, ids),
    ]
    if h5ad_out is not None:
        loci = model.loci
        h5ad = outputs.enter_context(
            h5ad_writer(
                h5ad_out,
                samples,
                genes,
                loci,
                model.config.latent_dim,
                {"locusformer": uns if uns is not None else model_uns(model)},
            )
        )
        writers.append(lambda rows, ids, X, c, z: h5ad(rows, X, c, z))
    return writers


def model_uns(model: TrainedModel) -> dict[str, Any]:
    """What the .h5ad says of the model that corrected it (``uns["locusformer"]``)."""
    record = model.record
    uns: dict[str, Any] = {
        "batch_names": list(record.batch_names),
        "protect": list(record.protect),
        "versions": {k: str(v) for k, v in record.versions.items()},
    }
    if record.seed is not None:
        uns["seed"] = int(record.seed)
    return uns


def mapping_uns(model: TrainedModel, report: dict[str, Any]) -> dict[str, Any]:
    """``uns["locusformer"]`` of a mapped query: the model's, and what the mapping did."""
    uns = model_uns(model)
    uns["mapping"] = {
        "new_batches": list(report["new_batches"]),
        "adapted": bool(report["adapted"]),
        "n_missing_loci": int(report["genes"]["n_missing"]),
    }
    return uns


@contextlib.contextmanager
def h5ad_writer(
    path: str | os.PathLike,
    samples: pd.DataFrame,
    genes: pd.Index,
    loci: pd.DataFrame | None,
    latent_dim: int,
    uns: dict[str, Any] | None = None,
) -> Iterator[Callable[[slice, np.ndarray, np.ndarray, np.ndarray], None]]:
    """Atomically write correct's .h5ad one block of rows at a time.

    Yields ``write(rows, X, corrected, latent)``. anndata writes the skeleton (obs, var,
    empty mappings); ``X``, ``layers/corrected`` and ``obsm/X_locusformer`` are then
    filled as h5py datasets carrying anndata's encoding of a dense array, so the file
    reads back with :func:`anndata.read_h5ad` like one written from memory.
    """
    import anndata as ad  # imported here: slow to import and only needed for this output
    import h5py

    obs = samples.copy(deep=False)  # columns replaced below, not changed in place
    # This generator's frame lives until the file is closed: holding the caller's table
    # there kept every sample's id and labels through correct's whole loop (1M samples:
    # about 0.1 GB).
    del samples
    obs.index = obs.index.astype(str).rename("sample_id")
    if loci is not None and loci["gene_id"].astype(str).tolist() == genes.tolist():
        var = loci.set_index(loci["gene_id"].astype(str).rename(None)).drop(columns="gene_id")
    else:
        var = pd.DataFrame(index=genes)
    var.index = var.index.astype(str)
    for frame in (obs, var):  # what anndata would do anyway, without telling on stderr
        for column in frame.select_dtypes(include="object").columns:
            frame[column] = frame[column].astype(str).astype("category")
    n, n_loci = len(obs), len(var)
    with atomic.atomic_path(path) as tmp:
        ad.AnnData(obs=obs, var=var, uns=uns or {}).write_h5ad(Path(tmp))
        del obs, var  # written; held by this generator's frame until the end otherwise
        with h5py.File(tmp, "r+") as handle:
            datasets = [
                handle.create_dataset("X", (n, n_loci), dtype="float32"),
                handle["layers"].create_dataset("corrected", (n, n_loci), dtype="float32"),
                handle["obsm"].create_dataset("X_locusformer", (n, latent_dim), dtype="float32"),
            ]
            for dataset in datasets:
                dataset.attrs["encoding-type"] = "array"
                dataset.attrs["encoding-version"] = "0.2.0"

            def write(rows: slice, *blocks: np.ndarray) -> None:
                for dataset, block in zip(datasets, blocks, strict=True):
                    dataset[rows] = block

            yield write
