"""Applying a trained model (:class:`~locusformer.train.checkpoint.TrainedModel`), and the
file-level steps.

``correct`` decodes every sample as if it came from the reference batch (a named batch,
or "mean": the average of all batch conditionings). It streams in chunks under
``torch.inference_mode`` so memory beyond the output does not grow with the number of
samples.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pandas as pd
import torch

from locusformer.errors import InputError
from locusformer.model.files import TrainedModel
from locusformer.train.data import as_matrix
from locusformer.train.runtime import autocast, resolve_device


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


#: Names a trained batch as the reference whatever its name: ``batch:mean`` is a batch
#: called "mean", where ``mean`` alone is the average of every batch's conditioning.
BATCH_PREFIX = "batch:"


def reference_code(model: TrainedModel, reference: str) -> int | None:
    """The network's code of batch ``reference``, None for "mean"; InputError otherwise.

    ``batch:NAME`` names the batch ``NAME`` explicitly, for a batch called "mean".
    """
    if reference == "mean":
        return None
    name = reference.removeprefix(BATCH_PREFIX)
    if name not in model.batch_names:
        valid = ", ".join(["mean", *model.batch_names])
        raise InputError("reference", f"unknown batch {name!r} (valid: {valid})")
    return model.batch_names.index(name)


def _model_matrix(model: TrainedModel, X: Any) -> np.ndarray:
    X = as_matrix(X)
    if X.shape[1] != model.n_loci:
        raise InputError(
            "expression matrix", f"has {X.shape[1]} loci, the model was trained on {model.n_loci}"
        )
    return X


def _prepare(
    model: TrainedModel, X: Any, batch_labels: Sequence[Any]
) -> tuple[np.ndarray, np.ndarray]:
    X = _model_matrix(model, X)
    if len(batch_labels) != X.shape[0]:
        raise InputError("batch labels", f"{len(batch_labels)} labels for {X.shape[0]} samples")
    return X, batch_codes(model, batch_labels)


#: Values per block of rows that run_correct reads, corrects and writes (16 MiB).
BLOCK_VALUES = 1 << 22

#: Samples per chunk of the model's forward pass. Small enough that a chunk's activations
#: (the feed-forward layer's are chunk x tokens x 256 floats) stay in the heap and in cache:
#: on CPU, 64 (4.9 MB of them) ran the model as fast as 128 and 1.1x as fast as 256, and
#: correct at 100k held 70 MB less than with 128 (issue 15).
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


def encode(
    model: TrainedModel,
    X: np.ndarray,
    *,
    chunk_size: int = CHUNK_SIZE,
    device: str | torch.device = "auto",
) -> np.ndarray:
    """The latent (n, Z) float32 of samples x loci ``X``: the encoder alone, the same
    numbers :func:`iter_correct` yields (the encoder never sees the batch)."""
    X = _model_matrix(model, X)
    if chunk_size < 1:
        raise InputError("batch_size", f"must be >= 1, got {chunk_size}")
    dev = resolve_device(device)
    net = model.module
    was_training = net.training
    net.eval().to(dev)
    latent = np.empty((X.shape[0], model.config.latent_dim), dtype=np.float32)
    try:
        with torch.inference_mode():
            for a in range(0, len(X), chunk_size):
                x = net.standardize(torch.from_numpy(X[a : a + chunk_size]).to(dev))
                with autocast(dev):
                    z, _ = net.encode(x)
                latent[a : a + chunk_size] = z.float().cpu().numpy()
    finally:
        net.train(was_training)
    return latent


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
    order = round_robin(codes)[:max_samples]
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


def round_robin(codes: np.ndarray) -> np.ndarray:
    """Sample indices interleaved across batches: b0[0], b1[0], ..., b0[1], b1[1], ..."""
    groups = [np.flatnonzero(codes == b) for b in np.unique(codes)]
    rank = np.concatenate([np.arange(len(g)) for g in groups])
    idx = np.concatenate(groups)
    return idx[np.lexsort((codes[idx], rank))]


# --------------------------------------------------------------------------------------
# File-level steps for the CLI (training's is train.run_train)
# --------------------------------------------------------------------------------------
