"""Synthetic multi-batch data sets with a known truth, for tests and benchmarks.

:func:`simulate` is small log-expression in memory (below); :func:`simulate_counts` with
:func:`write_simulation` is raw counts of any size on disk (``locusformer simulate``).

Log-expression follows the location/scale model of ComBat::

    x[i, g] = mu[g] + shift[b, g] + scale[b, g] * (effect[k, g] + noise[i, g])

for sample i of batch b and group (cell type) k. Group effects sit in contiguous blocks
of loci, as co-regulated neighbourhoods would, so genomic order carries information.

The batch effect is gene-wise (``batch_effect="gene"``: ``shift[b, g]`` and ``scale[b, g]``
drawn independently for every gene), regional (``"regional"``: one shift and one scale per
batch and *segment*, a run of consecutive loci on one chromosome, as position-dependent
artefacts such as copy number, chromatin or GC content act) or the sum of both
(``"both"``); :func:`draw_regions` cuts the segments and the simulation returns them with
each batch's values, the truth a corrector should remove.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
from scipy import sparse

from locusformer.errors import InputError
from locusformer.io.annotation import BUNDLED_ANNOTATION
from locusformer.io.atomic import atomic_path
from locusformer.simulate.genome import pick_genes, regional_batch_effect, simulate_loci
from locusformer.simulate.params import (
    BatchEffect,
    CountSimulationParams,
    RegionKind,
    check_regional,
)


class Simulation(NamedTuple):
    X: np.ndarray  # (n, L) float32 log-expression with batch effects and noise
    batch: np.ndarray  # (n,) int64 batch codes 0..n_batches-1
    group: np.ndarray  # (n,) int64 group labels 0..n_groups-1
    loci: pd.DataFrame  # L rows in genomic order, columns as produced by preprocessing
    signal: np.ndarray  # (n, L) float32 mu + group effect: no batch effect, no noise
    # The segments of a regional batch effect and each batch's shift and scale on them
    # (draw_regions, regional_batch_effect); None for a gene-wise one. Last, with a
    # default, so that code building or reading the first five fields is unchanged.
    regions: pd.DataFrame | None = None


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
    batch_effect: BatchEffect = "gene",
    region_size: float = 30.0,
    region_kind: RegionKind = "segments",
    seed: int = 0,
) -> Simulation:
    """Simulate ``n_samples`` x ``n_loci`` log-expression.

    Parameters
    ----------
    batch_shift
        Standard deviation of the additive batch effect per batch and gene (or segment).
    batch_scale
        Standard deviation of the log of the multiplicative batch effect.
        ``batch_shift=batch_scale=0`` gives data without any batch effect.
    group_effect
        Standard deviation of a group's deviation on its marker loci.
    marker_fraction
        Fraction of loci that are markers of some group (in blocks of ``block_size``).
    noise
        Standard deviation of the per-sample noise (before the batch scale).
    batch_effect
        ``"gene"``: ``shift`` and ``scale`` independent for every batch and locus.
        ``"regional"``: constant on each segment of consecutive loci (one chromosome), of
        the same standard deviations; unplaced loci get none (they have no position).
        ``"both"``: the gene-wise effect plus the regional one (shifts add, scales
        multiply). The samples, groups, noise and loci are the same for all three.
    region_size
        Mean length of a segment, in loci (lengths vary, a gamma of shape 4).
    region_kind
        ``"segments"`` of about ``region_size`` loci, or ``"arms"``: every chromosome
        cut in two at a point drawn between 30% and 70% of its loci (``region_size``
        unused).

    Returns
    -------
    The simulation; its ``regions`` are :func:`regional_batch_effect`'s table (None for
    ``batch_effect="gene"``).
    """
    check_regional(batch_effect, region_size, region_kind)
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
    # The loci are the stream's last draw, as before the regional effect existed, and the
    # segments have a stream of their own: "gene" reproduces the old output bit for bit.
    loci = simulate_loci(n_loci, n_chromosomes, unplaced_fraction, rng)
    regions = None
    if batch_effect != "gene":
        regions, region_shift, region_scale = regional_batch_effect(
            loci,
            [str(b) for b in range(n_batches)],
            shift_sd=batch_shift,
            scale_sd=batch_scale,
            region_size=region_size,
            kind=region_kind,
            rng=np.random.default_rng([seed, 2]),
        )
        if batch_effect == "regional":
            shift, scale = region_shift, region_scale
        else:
            shift, scale = shift + region_shift, scale * region_scale
    X = mu + shift[batch] + scale[batch] * (effect[group] + eps)
    return Simulation(
        X=X.astype(np.float32),
        batch=batch.astype(np.int64),
        group=group.astype(np.int64),
        loci=loci,
        signal=signal.astype(np.float32),
        regions=regions,
    )


# --------------------------------------------------------------------------------------
# Count data sets of any size, written to disk (``locusformer simulate``)
# --------------------------------------------------------------------------------------
#
# Unlike :func:`simulate` (log-expression in memory, synthetic loci), this writes raw
# counts for real human genes, a sample sheet and the truth, in chunks of samples, so a
# million samples never need the dense matrix in memory. For sample i of batch b and
# group k, gene g:
#
#     mean[i, g] = base[g] * library[i] * depth[b] * exp(shift[b, g] + scale[b, g] * effect[k, g])
#     count[i, g] ~ NegativeBinomial(mean[i, g], dispersion[g]), then set to 0 with
#                   probability dropout[b] / (1 + mean[i, g])
#
# ``effect[k]`` is group k's programme: log fold changes on a few genomic neighbourhoods
# (consecutive genes in genomic order), so locus order carries information. ``shift`` and
# ``scale`` are gene-wise, regional (constant on segments of consecutive genes) or both,
# as in :func:`simulate`.

SIM_CHUNK = 4096  # samples per random stream and per written chunk (fixed: reproducible)
PARQUET_MAX_SAMPLES = 20_000  # parquet holds one column per sample and is written dense


def default_annotation() -> Path:
    """``resources/hs_gene_coordinates.tsv.gz`` of the source tree."""
    return BUNDLED_ANNOTATION


@dataclass
class CountSimulation:
    """The fixed part of a count simulation; :meth:`chunks` draws the counts."""

    params: CountSimulationParams
    genes: pd.DataFrame  # n_genes rows in output order: gene_id, symbol, chrom, start, end, ...
    samples: pd.DataFrame  # n_samples rows: sample_id, batch, group (the truth)
    log_base: np.ndarray  # (G,)
    dispersion: np.ndarray  # (G,)
    effect: np.ndarray  # (K, G) group programmes (log fold changes)
    shift: np.ndarray  # (B, G)
    scale: np.ndarray  # (B, G)
    log_depth: np.ndarray  # (B,)
    dropout: np.ndarray  # (B,)
    batch_code: np.ndarray  # (n,) int
    group_code: np.ndarray  # (n,) int
    # Segments of a regional batch effect (regional_batch_effect's table; indices in
    # genomic order, not the output order) with each batch's shift and scale; None when
    # the effect is gene-wise.
    regions: pd.DataFrame | None = None

    def chunks(self, size: int = SIM_CHUNK) -> Iterator[tuple[int, sparse.csr_matrix]]:
        """Yield ``(first_row, counts)`` blocks of samples x genes float32 CSR counts.

        Each block of ``SIM_CHUNK`` samples has its own random stream, so the counts do
        not depend on how they are written.
        """
        if size != SIM_CHUNK:
            raise ValueError(f"chunks are {SIM_CHUNK} samples (reproducibility)")
        p = self.params
        inv_disp = 1.0 / self.dispersion
        for first in range(0, p.n_samples, size):
            rows = slice(first, min(first + size, p.n_samples))
            rng = np.random.default_rng([p.seed, 1, first // size])
            b, k = self.batch_code[rows], self.group_code[rows]
            n = len(b)
            log_lib = rng.normal(0.0, p.library_sd, size=n) + self.log_depth[b]
            log_mean = self.log_base + self.shift[b] + self.scale[b] * self.effect[k]
            log_mean += log_lib[:, None]
            mean = np.exp(log_mean)
            # Gamma-Poisson: negative binomial with mean `mean` and var mean + d mean^2.
            lam = rng.gamma(inv_disp, mean * self.dispersion)
            try:
                counts = rng.poisson(lam).astype(np.float32)
            except ValueError as err:  # a tail draw beyond what numpy can draw
                raise InputError(
                    "simulate",
                    f"a count too large to draw ({err}): lower mean_log_expression, "
                    "group_effect or the batch effects",
                ) from None
            drop = rng.random(counts.shape) < self.dropout[b][:, None] / (1.0 + mean)
            counts[drop] = 0.0
            yield first, sparse.csr_matrix(counts)

    def truth(self) -> dict[str, Any]:
        """Parameters and the drawn batch and group structure, as plain JSON data."""
        batches = sorted(self.samples["batch"].unique())
        groups = sorted(self.samples["group"].unique())
        programme = {
            g: self.genes.loc[self.effect[i] != 0, "gene_id"].tolist() for i, g in enumerate(groups)
        }
        truth: dict[str, Any] = {
            "params": dataclasses.asdict(self.params),
            "model": (
                "count ~ NB(base[g] * library[i] * depth[b] * exp(shift[b,g] + "
                "scale[b,g] * effect[k,g]), dispersion[g]); dropout[b] / (1 + mean)"
            ),
            "batches": {
                name: {
                    "n_samples": int((self.batch_code == i).sum()),
                    "depth": float(np.exp(self.log_depth[i])),
                    "dropout": float(self.dropout[i]),
                }
                for i, name in enumerate(batches)
            },
            "groups": {
                name: {
                    "n_samples": int((self.group_code == i).sum()),
                    "programme_genes": programme[name],
                }
                for i, name in enumerate(groups)
            },
        }
        if self.regions is not None:
            # One record per segment; shifts and scales as {batch: value}.
            truth["regions"] = [
                {
                    **{k: v for k, v in row.items() if not k.startswith(("shift_", "scale_"))},
                    "shift": {b: row[f"shift_{b}"] for b in batches},
                    "scale": {b: row[f"scale_{b}"] for b in batches},
                }
                for row in _plain_records(self.regions)
            ]
        return truth


def _plain_records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Rows as dicts of Python scalars (numpy's are not JSON)."""
    return [
        {k: v.item() if hasattr(v, "item") else v for k, v in row.items()}
        for row in frame.to_dict(orient="records")
    ]


def simulate_counts(
    params: CountSimulationParams | None = None,
    *,
    annotation: str | os.PathLike | None = None,
    **overrides: Any,
) -> CountSimulation:
    """Draw the structure of a multi-batch count data set (counts come from ``chunks``).

    Parameters
    ----------
    params
        The settings; keyword ``overrides`` replace single fields
        (``simulate_counts(n_samples=10_000, n_batches=4)``).
    annotation
        Gene table with ``ensembl_id``, ``chrom``, ``start``, ``end`` (default: the
        bundled ``resources/hs_gene_coordinates.tsv.gz``); genes are drawn from it.
    """
    p = dataclasses.replace(params or CountSimulationParams(), **overrides)
    p.validate()
    rng = np.random.default_rng([p.seed, 0])
    genes = pick_genes(annotation or default_annotation(), p.n_genes, rng)
    G, B, K = p.n_genes, p.n_batches, p.n_groups

    # Groups' programmes on genomic neighbourhoods (blocks of consecutive genes).
    effect = np.zeros((K, G))
    n_blocks = max(1, round(p.programme_fraction * G / p.block_size)) if p.programme_fraction else 0
    for k in range(K):
        for _ in range(n_blocks):
            a = int(rng.integers(0, max(1, G - p.block_size + 1)))
            # Mostly up-regulated, as marker programmes are.
            effect[k, a : a + p.block_size] = np.abs(rng.normal(0.0, p.group_effect)) * (
                1 if rng.random() < 0.8 else -1
            )
    genes["programme"] = [
        ",".join(f"group{k + 1}" for k in np.flatnonzero(effect[:, g])) for g in range(G)
    ]
    log_base = rng.normal(p.mean_log_expression, p.sd_log_expression, size=G)
    dispersion = p.dispersion * np.exp(rng.normal(0.0, 0.5, size=G))
    shift = rng.normal(0.0, p.batch_shift, size=(B, G))
    scale = np.exp(rng.normal(0.0, p.batch_scale, size=(B, G)))
    log_depth = rng.normal(0.0, p.batch_depth, size=B)
    dropout = np.clip(p.dropout * rng.uniform(0.5, 1.5, size=B), 0.0, 0.99)
    regions = None
    if p.batch_effect != "gene":
        # A stream of its own: the rest of the data set is the same whatever the effect.
        regions, region_shift, region_scale = regional_batch_effect(
            genes,
            [f"batch{b + 1}" for b in range(B)],
            shift_sd=p.batch_shift,
            scale_sd=p.batch_scale,
            region_size=p.region_size,
            kind=p.region_kind,
            rng=np.random.default_rng([p.seed, 2]),
        )
        if p.batch_effect == "regional":
            shift, scale = region_shift, region_scale
        else:
            shift, scale = shift + region_shift, scale * region_scale

    # Batches of unequal size, each with its own mix of groups.
    batch_share = rng.dirichlet(np.full(B, 5.0))
    batch_code = rng.choice(B, size=p.n_samples, p=batch_share)
    batch_code[:B] = np.arange(B)[: p.n_samples]  # every batch has a sample
    mix = rng.dirichlet(np.full(K, 3.0), size=B)  # (B, K)
    u = rng.random(p.n_samples)
    group_code = (u[:, None] > np.cumsum(mix[batch_code], axis=1)).sum(axis=1)
    group_code = np.minimum(group_code, K - 1)

    # Output order: by gene id, as matrices usually come; the genomic order is the model's.
    order = np.argsort(genes["gene_id"].to_numpy(), kind="stable")
    genes = genes.iloc[order].reset_index(drop=True)
    width = len(str(p.n_samples - 1))
    samples = pd.DataFrame(
        {
            "sample_id": [f"cell{i:0{width}d}" for i in range(p.n_samples)],
            "batch": [f"batch{b + 1}" for b in batch_code],
            "group": [f"group{k + 1}" for k in group_code],
        }
    )
    return CountSimulation(
        params=p,
        genes=genes,
        samples=samples,
        log_base=log_base[order],
        dispersion=dispersion[order],
        effect=effect[:, order],
        shift=shift[:, order],
        scale=scale[:, order],
        log_depth=log_depth,
        dropout=dropout,
        batch_code=batch_code.astype(np.int64),
        group_code=group_code.astype(np.int64),
        regions=regions,
    )


def write_counts(sim: CountSimulation, path: str | os.PathLike) -> dict[str, Any]:
    """Write the counts: samples x genes sparse ``.h5ad`` (chunked) or genes x samples
    ``.parquet`` (dense, up to ``PARQUET_MAX_SAMPLES`` samples). Atomic. Returns
    ``{"n_samples", "n_genes", "nnz"}``."""
    path = Path(path)
    suffix = path.suffix.lower()
    p = sim.params
    if suffix not in {".h5ad", ".parquet"}:
        raise InputError(path, "simulate writes .h5ad (sparse, any size) or .parquet")
    if suffix == ".parquet" and p.n_samples > PARQUET_MAX_SAMPLES:
        raise InputError(
            path,
            f"{p.n_samples} samples: parquet holds one column per sample and is written "
            f"dense; use .h5ad above {PARQUET_MAX_SAMPLES} samples",
        )
    nnz = 0
    with atomic_path(path) as tmp:
        if suffix == ".h5ad":
            nnz = _write_h5ad_chunked(sim, tmp)
        else:
            dense = np.zeros((p.n_genes, p.n_samples), dtype=np.int32)
            for first, block in sim.chunks():
                dense[:, first : first + block.shape[0]] = block.toarray().T
                nnz += block.nnz
            frame = pd.DataFrame(dense, columns=sim.samples["sample_id"].tolist())
            frame.insert(0, "gene_id", sim.genes["gene_id"].to_numpy())
            frame.to_parquet(tmp, index=False, engine="pyarrow")
    return {"n_samples": p.n_samples, "n_genes": p.n_genes, "nnz": int(nnz)}


def _write_h5ad_chunked(sim: CountSimulation, path: Path) -> int:
    import anndata as ad
    import h5py

    obs = sim.samples.set_index("sample_id")
    obs = obs.astype({"batch": "category", "group": "category"})
    var = sim.genes.set_index("gene_id")
    nnz = 0
    with h5py.File(path, "w") as f:
        f.attrs["encoding-type"] = "anndata"
        f.attrs["encoding-version"] = "0.1.0"
        ad.io.write_elem(f, "obs", obs)
        ad.io.write_elem(f, "var", var)
        for key in ("obsm", "varm", "obsp", "varp", "layers"):
            ad.io.write_elem(f, key, {})
        ad.io.write_elem(f, "uns", {"simulation": json.dumps(sim.truth()["params"])})
        X = None
        for _, block in sim.chunks():
            nnz += block.nnz
            if X is None:
                ad.io.write_elem(f, "X", block)
                X = ad.io.sparse_dataset(f["X"])
            else:
                X.append(block)
    return nnz


def write_simulation(
    sim: CountSimulation,
    expression: str | os.PathLike,
    samples: str | os.PathLike,
    *,
    truth: str | os.PathLike | None = None,
    row: str | os.PathLike | None = None,
    name: str = "simulated",
    annotation: str | os.PathLike | None = None,
    regions: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Write counts, the sample sheet (``sample_id``, ``batch``, ``group``: the truth) and
    optionally the truth JSON, a one-row datasets sheet (``config/datasets.tsv`` format)
    naming them and, for a regional batch effect, the segments with each batch's shift and
    scale as a TSV (``regions``; the truth JSON holds them too). Paths in the row are
    written as given."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name) or name.startswith("-"):
        raise InputError("simulate name", f"{name!r}: use letters, digits, '_', '.', '-'")
    if regions is not None and sim.regions is None:
        raise InputError("simulate --out-regions", "the batch effect is gene-wise: no regions")
    stats = write_counts(sim, expression)
    with atomic_path(samples) as tmp:
        sim.samples.to_csv(tmp, sep="\t", index=False)
    if truth is not None:
        with atomic_path(truth) as tmp:
            tmp.write_text(json.dumps({**sim.truth(), **stats}, indent=1) + "\n")
    if regions is not None:
        with atomic_path(regions) as tmp:
            sim.regions.to_csv(tmp, sep="\t", index=False)
    if row is not None:
        sheet = pd.DataFrame(
            [
                {
                    "name": name,
                    "expression": str(expression),
                    "samples": str(samples),
                    "sample_column": "sample_id",
                    "batch_key": "batch",
                    "label_key": "group",
                    "genes": str(annotation or default_annotation()),
                    "gene_id": "ensembl_id",
                    "value_type": "counts",
                }
            ]
        )
        with atomic_path(row) as tmp:
            sheet.to_csv(tmp, sep="\t", index=False)
    return stats
