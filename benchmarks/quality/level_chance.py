"""The level term corrected for chance (issue 38): a probe.

The level term (:func:`locusformer.model.losses.level_batch_share`) is the share of the
latent's variance that the batch explains within each level (the input's clusters, and
the protected covariates), computed on one minibatch. With the default 8 input clusters,
8 batches and minibatches of 64, most (level, batch) cells of a minibatch hold one sample
or none, and a cell of one sample "explains" all of that sample's spread about its level's
mean: with no batch effect at all the term is about half the latent's variance
(``--chance`` prints it). So it pulls every sample towards its level's mean, biology
within the level included.

The variant ``chance`` removes what random batch labels would give: per level, the
between-cell sum of squares less its expectation under permuted labels,
``(cells - 1) / (samples - 1)`` times the level's sum of squares about its mean (one-way
ANOVA), kept only above zero, that expectation held constant in the gradient, and only
for levels where some cell holds two samples or more (a level of single-sample cells
tells nothing about the batch). The term then acts on the batch alone and stops at
chance.

Each data set is trained once per variant at the defaults and corrected as the suite
does; rows scored as the suite scores them.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/level_chance.py --out OUT.tsv \\
        --scenarios middle mixtures n-150 bulk-6-batches
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/level_chance.py --out OUT.tsv --chance

One row per (data set, variant, seed) appended to ``--out``: data set, variant, seed,
batch, bio, total, seconds (training).
"""

from __future__ import annotations

import sys
import time
from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probes import append_row, each_dataset, probe_parser, score_matrix

VARIANTS = ("default", "chance")


def level_batch_share_chance(z: Tensor, batch: Tensor, levels: Tensor, n_batches: int) -> Tensor:
    """:func:`~locusformer.model.losses.level_batch_share` less its expectation under
    permuted batch labels, per level, kept above zero."""
    from locusformer.model.losses import level_means

    z = z.float()
    m = level_means(z, batch, levels, n_batches)
    n_levels = len(m.level_size)

    def per_level(values: Tensor) -> Tensor:  # (B,) summed into (M,)
        return torch.zeros(n_levels, dtype=values.dtype).index_add(0, levels, values)

    between = per_level((m.cell - m.level).pow(2).sum(-1))  # (M,)
    within = per_level((z - m.level).pow(2).sum(-1))  # (M,)
    cells = m.batches_held.float()
    chance = (cells - 1.0) / (m.level_size - 1.0).clamp_min(1.0)
    informative = ((cells >= 2) & (m.level_size > cells)).float()
    excess = informative * F.relu(between - chance * within.detach())
    total = (z - z.mean(dim=0)).pow(2).sum()
    return excess.sum() / total.clamp_min(1e-8)


@contextmanager
def level_term(variant: str):
    """The network's level term replaced by ``variant``'s for the duration."""
    from locusformer.model import network

    original = network.level_batch_share
    if variant == "chance":
        network.level_batch_share = level_batch_share_chance
    try:
        yield
    finally:
        network.level_batch_share = original


def chance_share(n: int = 64, levels: int = 8, batches: int = 8, draws: int = 2000) -> None:
    """Print the default term's mean on random latents with random batch labels (no batch
    effect), and the chance-corrected term's."""
    from locusformer.model.losses import level_batch_share

    g = torch.Generator().manual_seed(0)
    z = torch.randn(n, 16, generator=g)
    lv = torch.randint(0, levels, (n,), generator=g)
    for name, term in (("default", level_batch_share), ("chance", level_batch_share_chance)):
        values = [
            term(z, torch.randint(0, batches, (n,), generator=g), lv, batches).item()
            for _ in range(draws)
        ]
        print(f"{name}: {sum(values) / draws:.3f} with no batch effect "
              f"({n} samples, {levels} levels, {batches} batches)")  # fmt: skip


def run(name, adata, loci, keys, seed, out: Path) -> None:
    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import correct
    from locusformer.train.loop import train_corrector

    uncorrected = run_method("uncorrected", adata.copy(), keys[0], 0)
    batches = adata.obs[keys[0]].astype(str).tolist()
    for variant in VARIANTS:
        start = time.perf_counter()
        with level_term(variant):
            model, _ = train_corrector(
                adata.X, batches, loci, None, None, seed=seed, progress=False
            )
        seconds = round(time.perf_counter() - start, 1)
        corrected, _ = correct(model, adata.X, batches)
        scores = score_matrix(corrected, adata, uncorrected, keys, seed)
        append_row(out, [name, variant, seed, *scores, seconds])


def main() -> None:
    parser = probe_parser(__doc__)
    parser.add_argument("--chance", action="store_true", help="print the terms' chance level")
    args = parser.parse_args()
    if args.chance:
        chance_share()
    for name, adata, loci, keys, seed in each_dataset(args):
        run(name, adata, loci, keys, seed, args.out)


if __name__ == "__main__":
    main()
