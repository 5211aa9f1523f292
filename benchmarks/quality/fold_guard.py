"""Can a label-free statistic tell a folded latent from a healthy one? (issue 38): a probe.

On shallow counts the input clusters' level term can fold the latent: the corrected
matrix keeps two principal axes where the run without the clusters keeps six, and bio
falls (notes of 2026-12-06). A guard would compare the corrected matrix with something the
fold cannot touch: the input, corrected quickly and without labels
(:func:`locusformer.train.alignment.quick_matrix`'s ComBat and mutual-neighbour re-centring).

For each simulated data set and seed this trains LocusFormer once per variant (the
defaults, and ``--off``: ``input_clusters`` 0), corrects as the suite does, scores it as
the suite does, and writes, beside the scores, statistics of the corrected matrix and of
the quick correction that need no label:

- ``pr``: participation ratio of the centred matrix's eigenvalues, (sum l)^2 / sum l^2;
- ``knn``: share of each sample's 15 nearest neighbours (50 PCs) in the corrected matrix
  that are among its 15 in the quick correction, averaged;
- ``top2``: share of the corrected matrix's variance on its first two axes.

``--capture FOLDER`` prints, for the matrices ``--save FOLDER`` kept, the quick
correction's structured axes and :func:`locusformer.train.fold.capture`, the statistic of
``training.fold_check``: the share of the quick correction's structured variance that the
corrected matrix's leading axes explain.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/fold_guard.py --out OUT.tsv \\
        --scenarios n-3000 --library shallow --seeds 0 1 2 --off

One row per (data set, variant, seed) appended to ``--out``: data set, variant, seed,
batch, bio, total, pr, pr_quick, knn, top2, seconds (training), axes_quick
(structured axes of the quick correction, Horn's parallel analysis).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "simulated"))

from probes import append_row, score_matrix  # noqa: E402
from suite import BATCH_KEY, LABEL_KEY, prepare  # noqa: E402

from locusformer.simulate.scenarios import SUITE  # noqa: E402
from locusformer.train.fold import capture, quick_correction, structured_axes  # noqa: E402

COLUMNS = (
    "data", "variant", "seed", "batch", "bio", "total", "pr", "pr_quick", "knn", "top2",
    "seconds", "axes_quick",
)  # fmt: skip
K = 15


def spectrum(x: np.ndarray, n: int = 50) -> tuple[np.ndarray, np.ndarray]:
    """Scores on, and variances of, the first ``n`` principal axes of ``x``."""
    from sklearn.utils.extmath import randomized_svd

    centred = x - x.mean(axis=0)
    u, s, _ = randomized_svd(centred, min(n, min(x.shape) - 1), random_state=0)
    total = float((centred**2).sum())
    return u * s, s**2 / total


def participation(x: np.ndarray) -> float:
    centred = x - x.mean(axis=0)
    gram = centred @ centred.T if x.shape[0] < x.shape[1] else centred.T @ centred
    lam = np.clip(np.linalg.eigvalsh(gram.astype(np.float64)), 0, None)
    return float(lam.sum() ** 2 / (lam**2).sum())


def neighbours(scores: np.ndarray) -> np.ndarray:
    from sklearn.neighbors import NearestNeighbors

    nn = NearestNeighbors(n_neighbors=K + 1).fit(scores)
    return nn.kneighbors(scores, return_distance=False)[:, 1:]


def knn_overlap(a: np.ndarray, b: np.ndarray) -> float:
    na, nb = neighbours(a), neighbours(b)
    return float(np.mean([len(np.intersect1d(x, y)) / K for x, y in zip(na, nb, strict=True)]))


def captures(folder: Path) -> None:
    """:func:`capture` of every matrix pair ``--save`` wrote into ``folder``."""
    for path in sorted(folder.glob("*.npz")):
        saved = np.load(path)
        m = structured_axes(saved["quick"], 0)
        share = capture(saved["corrected"], saved["quick"], 0)
        print(f"{path.stem}\t{m}\t{share:.3f}", flush=True)


def prepare_file(expression: Path, samples: Path):
    """A ``locusformer simulate`` data set (samples x genes .h5ad and its sample sheet)
    as :func:`suite.prepare` hands a scenario on: normalized, loci in genomic order by the
    bundled gene table."""
    import anndata as ad
    import pandas as pd

    from locusformer.io.annotation import bundled_annotation, read_annotation
    from locusformer.pp.loci import order_loci
    from locusformer.pp.normalize import NormalizeParams, normalize

    raw = ad.read_h5ad(expression)
    sheet = pd.read_csv(samples, sep="\t").set_index("sample_id")
    raw.obs = sheet.loc[raw.obs_names, [BATCH_KEY, LABEL_KEY]].astype("category")
    normalized, _ = normalize(raw, "counts", BATCH_KEY, NormalizeParams(), source=str(expression))
    annotation = read_annotation(bundled_annotation(), "ensembl_id")
    loci, _ = order_loci(normalized.var_names, annotation, "ensembl_id")
    ordered = normalized[:, loci["gene_id"].tolist()].copy()
    del ordered.layers["counts"]
    return ordered, None, loci


def run(name: str, scenario, seed: int, variants: list[str], out: Path, save: Path | None) -> None:
    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import correct
    from locusformer.train.loop import train_corrector

    adata, _, loci = prepare(scenario, seed) if scenario is not None else prepare_file(*name)
    if scenario is None:
        name = str(name[0].parent.name)
    x = np.asarray(adata.X, dtype=np.float32)
    codes = adata.obs[BATCH_KEY].cat.codes.to_numpy()
    quick = quick_correction(x, codes, seed)
    quick_scores, _ = spectrum(quick)
    pr_quick = participation(quick)
    axes_quick = structured_axes(quick, seed)
    uncorrected = run_method("uncorrected", adata.copy(), BATCH_KEY, 0)
    batches = adata.obs[BATCH_KEY].astype(str).tolist()
    for variant in variants:
        training = {"input_clusters": 0} if variant == "off" else None
        start = time.perf_counter()
        model, _ = train_corrector(x, batches, loci, None, training, seed=seed, progress=False)
        seconds = time.perf_counter() - start
        corrected, _ = correct(model, x, batches)
        corrected = np.asarray(corrected, dtype=np.float32)
        scored = score_matrix(corrected, adata, uncorrected, (BATCH_KEY, LABEL_KEY), seed)
        scores, share = spectrum(corrected)
        if save is not None:
            save.mkdir(parents=True, exist_ok=True)
            np.savez_compressed(
                save / f"{name.replace(' ', '_')}-{variant}-{seed}.npz", corrected=corrected,
                quick=quick, label=adata.obs[LABEL_KEY].astype(str).to_numpy(), batch=codes,
            )  # fmt: skip
        row = [
            name, variant, seed, *scored, participation(corrected), pr_quick,
            knn_overlap(scores, quick_scores), float(share[:2].sum()), round(seconds, 1),
            axes_quick,
        ]  # fmt: skip
        append_row(out, [f"{v:.4f}" if isinstance(v, float) else v for v in row])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--scenarios", nargs="+", default=list(SUITE), choices=list(SUITE))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0])
    parser.add_argument("--library", default=None, choices=("single_cell", "bulk", "shallow"))
    parser.add_argument("--off", action="store_true", help="also train with input_clusters 0")
    parser.add_argument("--save", type=Path, default=None, help="folder for the matrices")
    parser.add_argument("--capture", type=Path, default=None, help="print --save's captures")
    parser.add_argument(
        "--files", nargs=2, type=Path, default=None, metavar=("H5AD", "SAMPLES"),
        help="a `locusformer simulate` data set instead of the scenarios",
    )  # fmt: skip
    args = parser.parse_args()
    if args.capture is not None:
        captures(args.capture)
        return
    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    variants = ["default", "off"] if args.off else ["default"]
    if args.files is not None:
        for seed in args.seeds:
            run(tuple(args.files), None, seed, variants, args.out, args.save)
        return
    for name in args.scenarios:
        scenario = SUITE[name]
        if args.library is not None:
            scenario = dataclasses.replace(scenario, library=args.library)
            name = f"{name} ({args.library})"
        for seed in args.seeds:
            run(name, scenario, seed, variants, args.out, args.save)


if __name__ == "__main__":
    main()
