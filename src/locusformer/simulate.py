"""A small synthetic multi-batch data set with a known truth, for tests and benchmarks.

Log-expression follows the location/scale model of ComBat::

    x[i, g] = mu[g] + shift[b, g] + scale[b, g] * (effect[k, g] + noise[i, g])

for sample i of batch b and group (cell type) k. Group effects sit in contiguous blocks
of loci, as co-regulated neighbourhoods would, so genomic order carries information.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import pandas as pd


class Simulation(NamedTuple):
    X: np.ndarray  # (n, L) float32 log-expression with batch effects and noise
    batch: np.ndarray  # (n,) int64 batch codes 0..n_batches-1
    group: np.ndarray  # (n,) int64 group labels 0..n_groups-1
    loci: pd.DataFrame  # L rows in genomic order, columns as produced by preprocessing
    signal: np.ndarray  # (n, L) float32 mu + group effect: no batch effect, no noise


def simulate(
    n_samples: int = 300,
    n_loci: int = 200,
    n_batches: int = 2,
    n_groups: int = 3,
    *,
    batch_shift: float = 1.0,
    batch_scale: float = 0.3,
    group_effect: float = 2.0,
    marker_fraction: float = 0.3,
    block_size: int = 8,
    noise: float = 0.5,
    n_chromosomes: int = 3,
    unplaced_fraction: float = 0.05,
    seed: int = 0,
) -> Simulation:
    """Simulate ``n_samples`` x ``n_loci`` log-expression.

    Parameters
    ----------
    batch_shift
        Standard deviation of the additive batch effect per batch and gene.
    batch_scale
        Standard deviation of the log of the multiplicative batch effect.
        ``batch_shift=batch_scale=0`` gives data without any batch effect.
    group_effect
        Standard deviation of a group's deviation on its marker loci.
    marker_fraction
        Fraction of loci that are markers of some group (in blocks of ``block_size``).
    noise
        Standard deviation of the per-sample noise (before the batch scale).
    """
    rng = np.random.default_rng(seed)
    batch = np.arange(n_samples) % n_batches
    rng.shuffle(batch)
    group = rng.integers(0, n_groups, size=n_samples)

    mu = rng.normal(5.0, 1.0, size=n_loci)
    effect = np.zeros((n_groups, n_loci))
    n_blocks = max(1, round(marker_fraction * n_loci / block_size))
    for _ in range(n_blocks):
        k = rng.integers(n_groups)
        a = rng.integers(0, max(1, n_loci - block_size))
        effect[k, a : a + block_size] += rng.normal(0.0, group_effect)
    shift = rng.normal(0.0, batch_shift, size=(n_batches, n_loci))
    scale = np.exp(rng.normal(0.0, batch_scale, size=(n_batches, n_loci)))

    signal = mu + effect[group]  # (n, L)
    eps = rng.normal(0.0, noise, size=(n_samples, n_loci))
    X = mu + shift[batch] + scale[batch] * (effect[group] + eps)
    return Simulation(
        X=X.astype(np.float32),
        batch=batch.astype(np.int64),
        group=group.astype(np.int64),
        loci=simulate_loci(n_loci, n_chromosomes, unplaced_fraction, rng),
        signal=signal.astype(np.float32),
    )


def simulate_loci(
    n_loci: int, n_chromosomes: int, unplaced_fraction: float, rng: np.random.Generator
) -> pd.DataFrame:
    """A loci table in genomic order: placed loci by chromosome and start, then unplaced."""
    n_unplaced = round(unplaced_fraction * n_loci)
    n_placed = n_loci - n_unplaced
    chrom_of = np.sort(rng.integers(1, n_chromosomes + 1, size=n_placed))
    starts = np.empty(n_placed, dtype=np.int64)
    for c in np.unique(chrom_of):
        idx = np.flatnonzero(chrom_of == c)
        starts[idx] = np.sort(rng.integers(1, 100_000_000, size=len(idx)))
    chrom = [f"chr{c}" for c in chrom_of] + [""] * n_unplaced
    start = pd.array(list(starts) + [None] * n_unplaced, dtype="Int64")
    return pd.DataFrame(
        {
            "gene_id": [f"g{i:05d}" for i in range(n_loci)],
            "chrom": chrom,
            "start": start,
            "end": start + 1000,
            "position": np.arange(n_loci),
            "placed": [True] * n_placed + [False] * n_unplaced,
        }
    )
