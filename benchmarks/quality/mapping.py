"""Leave-one-batch-out mapping on the five CellBench sets (issue 14).

For each held-out set and seed: LocusFormer is trained (default config) on the other
four, and the fifth is mapped onto it with ``locusformer.infer.mapping.map_query``, zero-shot
and with ``--adapt-epochs`` of adaptation; scVI is trained on the four with the
reference-mapping setup of scvi-tools' scArches tutorial and the fifth added by surgery
(``SCVI.prepare_query_anndata``, ``SCVI.load_query_data``, ``train(max_epochs=200,
plan_kwargs=dict(weight_decay=0.0))``). The combined reference + query is scored with the
workflow's scIB metrics (``locusformer.scoring.metrics.score_method``) against LocusFormer, scVI,
Harmony and ComBat run on all five (de novo). Beside the scores: kNN label transfer
(k = 15 reference neighbours in the latent; accuracy and macro-F1 on the query), how the
plate-only lines A549 and H838 fare, the reference outputs checked bitwise unchanged by
the mapping (asserted), and the seconds of training and of mapping.

The task is prepared once with the workflow's own normalize and order-loci rules
(``variants.prepare``): every method sees the same 2,000 genes, chosen on all five sets.
One row per (held-out set, method, seed) is appended to ``--work``/results.tsv.

    .venv/bin/python benchmarks/quality/mapping.py --seeds 0
    .venv/bin/python benchmarks/quality/mapping.py --heldout CEL-seq2 plate1 --seeds 1 2
    .venv/bin/python benchmarks/quality/mapping.py --table [--seeds 0] [--heldout ...]
    .venv/bin/python benchmarks/quality/mapping.py --surgery-only --seeds 0 1 2

Needs ``../shared/data`` (the CellBench files) and scvi-tools.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tasks import SETS, TASKS
from variants import prepare

ROOT = Path(__file__).resolve().parents[2]
COLUMNS = [
    "task", "heldout", "method", "seed", "batch", "bio", "total", "accuracy", "macro_f1",
    "plate_only_share", "absorbed", "train_s", "map_s",
]  # fmt: skip
#: The lines only the three plates hold.
PLATE_ONLY = ("A549", "H838")
K = 15
#: scvi-tools' scArches tutorial's reference model: the encoder sees the batch (so that
#: surgery has query weights to learn there), layer norm instead of batch norm.
ARCHES = dict(
    use_layer_norm="both", use_batch_norm="none", encode_covariates=True, dropout_rate=0.2,
    n_layers=2,
)  # fmt: skip


def vote(neighbours: np.ndarray) -> np.ndarray:
    """The most frequent label of each row of neighbours' labels (n, K)."""
    return np.array([pd.Series(row).value_counts().index[0] for row in neighbours])


def confusions(truth: np.ndarray, predicted: np.ndarray, top: int | None = None) -> str:
    """The errors as "true->predicted:count", most frequent first (the ``top`` first); "-"
    when there are none."""
    wrong = pd.Series([f"{a}->{b}" for a, b in zip(truth, predicted, strict=True) if a != b])
    counts = wrong.value_counts()
    counts = counts if top is None else counts.head(top)
    return " ".join(f"{k}:{v}" for k, v in counts.items()) or "-"


def knn_transfer(rep: np.ndarray, labels: np.ndarray, query: np.ndarray) -> dict[str, float]:
    """Reference (``~query``) labels -> query by a majority of K reference neighbours.

    ``plate_only_share``: for a query holding A549 or H838, the mean share of those cells'
    reference neighbours of their own line; for a query without them, the mean share of
    the reference's A549 and H838 cells' K neighbours among all cells that are of their
    own line (do the query's cells crowd in?). ``absorbed``: the share of the query's
    other cells predicted as A549 or H838. Macro-F1 averages over the lines the query
    holds.
    """
    from sklearn.metrics import accuracy_score, f1_score
    from sklearn.neighbors import NearestNeighbors

    ref = ~query
    ref_idx = np.flatnonzero(ref)
    nn = NearestNeighbors(n_neighbors=K).fit(rep[ref])
    neighbours = labels[ref_idx[nn.kneighbors(rep[query])[1]]]  # (n_query, K)
    predicted = vote(neighbours)
    truth = labels[query]
    only = np.isin(truth, PLATE_ONLY)
    if only.any():
        share = float((neighbours[only] == truth[only, None]).mean())
    else:
        ref_only = ref_idx[np.isin(labels[ref], PLATE_ONLY)]
        around = NearestNeighbors(n_neighbors=K + 1).fit(rep).kneighbors(rep[ref_only])[1]
        share = float((labels[around[:, 1:]] == labels[ref_only, None]).mean())
    return {
        "accuracy": float(accuracy_score(truth, predicted)),
        # Over the query's own lines: a cell given a line the query lacks lowers the recall
        # of its true line (and is counted in ``absorbed``), not a class of zero support.
        "macro_f1": float(f1_score(truth, predicted, labels=np.unique(truth), average="macro")),
        "plate_only_share": share,
        "absorbed": float(np.isin(predicted[~only], PLATE_ONLY).mean()),
    }


class Bench:
    """The task in memory, the uncorrected reference result, and the results table."""

    def __init__(self, task: str, work: Path) -> None:
        import anndata as ad

        from locusformer.baselines.methods import run_method
        from locusformer.io.parquet import read_matrix_parquet

        d = work / "results" / task
        ordered = read_matrix_parquet(d / "ordered.parquet", "ordered matrix")
        self.task, self.out = task, work / "results.tsv"
        self.loci = pd.read_parquet(d / "loci.parquet")
        samples = pd.read_csv(d / "samples.tsv", sep="\t", index_col=0, dtype=str)
        self.obs = samples.loc[ordered.index].copy()
        self.X = ordered.to_numpy(np.float32)
        self.adata = ad.AnnData(X=self.X, obs=self.obs.copy())
        self.adata.var_names = ordered.columns
        for key in ("batch", "cell_line"):
            self.adata.obs[key] = self.adata.obs[key].astype("category")
        counts = read_matrix_parquet(d / "counts.parquet", "count matrix")
        self.counts = counts.loc[ordered.index, ordered.columns]
        self.batches = self.obs["batch"].to_numpy()
        self.labels = self.obs["cell_line"].to_numpy()
        self.uncorrected = run_method("uncorrected", self.adata.copy(), "batch", 0)

    def done(self) -> set[tuple[str, str, int]]:
        if not self.out.exists():
            return set()
        rows = pd.read_csv(self.out, sep="\t", header=None, names=COLUMNS)
        rows = rows[rows["task"] == self.task]
        return set(zip(rows["heldout"], rows["method"], rows["seed"], strict=True))

    def score(self, result, seed: int) -> dict[str, float]:
        from locusformer.scoring.metrics import score_method

        v = score_method(result, self.uncorrected, "batch", "cell_line", seed=seed)
        v = v.set_index("metric")["value"]
        return {
            "batch": v["Batch correction"], "bio": v["Bio conservation"], "total": v["Total"]
        }  # fmt: skip

    def keep(self, heldout: str, method: str, seed: int, rep: np.ndarray) -> None:
        """The representation label transfer read, for a later look (``--work``/reps)."""
        path = self.out.parent / "reps" / f"{heldout}_{method.replace(' ', '_')}_{seed}.npy"
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(path, rep.astype(np.float32))

    def record(self, heldout: str, method: str, seed: int, values: dict) -> None:
        row = {"task": self.task, "heldout": heldout, "method": method, "seed": seed, **values}
        line = "\t".join(
            str(round(row[c], 4)) if isinstance(row.get(c), float) else str(row.get(c, ""))
            for c in COLUMNS
        )
        print(line, flush=True)
        with open(self.out, "a") as fh:
            fh.write(line + "\n")

    def result(self, method: str, matrix: np.ndarray | None, latent: np.ndarray | None):
        from locusformer.io.results import make_result

        representation = "matrix" if matrix is not None else "embedding"
        return make_result(
            matrix if matrix is not None else self.X, method=method,
            representation=representation, obs=self.adata.obs, var_names=self.adata.var_names,
            embedding=latent if matrix is None else None, batch_key="batch",
            label_key="cell_line",
        )  # fmt: skip


def de_novo(
    bench: Bench, seed: int, heldouts: list[str], baselines: bool = True, training=None
) -> None:
    """LocusFormer (``training``'s settings over the defaults), scVI, Harmony and ComBat
    (``baselines``) on all five sets; label transfer per held-out."""
    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import correct
    from locusformer.scoring.metrics import scoring_representation
    from locusformer.train.loop import train_corrector

    runs: dict[str, tuple[Any, float]] = {}
    start = time.perf_counter()
    model, _ = train_corrector(
        bench.X, bench.batches.tolist(), bench.loci, train_config=training, seed=seed,
        device="cpu", progress=False,
    )  # fmt: skip
    trained = time.perf_counter() - start
    corrected, latent = correct(model, bench.X, bench.batches.tolist(), device="cpu")
    seconds = time.perf_counter() - start
    runs["locusformer de novo"] = (bench.result("locusformer", corrected, None), seconds)
    runs["locusformer_latent de novo"] = (bench.result("locusformer", None, latent), seconds)
    reps = {name: latent for name in runs}
    for method in ("scvi", "harmony", "combat") if baselines else ():
        start = time.perf_counter()
        result = run_method(method, bench.adata.copy(), "batch", seed, counts=bench.counts)
        name = f"{method} de novo"
        runs[name] = (result, time.perf_counter() - start)
        reps[name] = scoring_representation(result, seed)
    for name, (result, seconds) in runs.items():
        bench.keep("all", name, seed, reps[name])
        scores = bench.score(result, seed)
        for heldout in heldouts:
            transfer = knn_transfer(reps[name], bench.labels, bench.batches == heldout)
            train_s = trained if name.startswith("locusformer") else seconds
            values = {**scores, **transfer, "train_s": train_s, "map_s": ""}
            bench.record(heldout, name, seed, values)


def zero_shot(
    bench: Bench, heldout: str | None, seed: int, training: dict | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """(corrected, latent) of every row: LocusFormer (default config, or ``training``'s
    settings over it) trained on the sets other than ``heldout`` and the held-out set
    mapped zero-shot; trained on all five (de novo) when ``heldout`` is None."""
    from locusformer.infer.correct import correct
    from locusformer.infer.mapping import map_query
    from locusformer.train.loop import train_corrector

    query = bench.batches == heldout
    ref = ~query
    Xr, br = bench.X[ref], bench.batches[ref].tolist()
    model, _ = train_corrector(
        Xr, br, bench.loci, train_config=training, seed=seed, device="cpu", progress=False
    )
    c, z = correct(model, Xr, br, device="cpu")
    corrected, latent = np.empty_like(bench.X), np.empty((len(bench.X), z.shape[1]), np.float32)
    corrected[ref], latent[ref] = c, z
    if query.any():
        mapped = map_query(
            model, bench.X[query], bench.batches[query].tolist(), seed=seed, device="cpu"
        )
        corrected[query], latent[query] = mapped.corrected, mapped.latent
    return corrected, latent


def map_locusformer(
    bench: Bench, heldout: str, seed: int, adapt_epochs: int, training=None
) -> None:
    import torch

    from locusformer.infer.correct import correct
    from locusformer.infer.mapping import map_query
    from locusformer.train.loop import train_corrector

    query = bench.batches == heldout
    ref = ~query
    Xr, br = bench.X[ref], bench.batches[ref].tolist()
    start = time.perf_counter()
    model, _ = train_corrector(
        Xr, br, bench.loci, train_config=training, seed=seed, device="cpu", progress=False
    )
    train_s = time.perf_counter() - start
    before = correct(model, Xr, br, device="cpu")
    weights = {k: v.clone() for k, v in model.module.state_dict().items()}
    mapped = {}
    for epochs in (0, adapt_epochs):
        start = time.perf_counter()
        result = map_query(
            model, bench.X[query], bench.batches[query].tolist(), adapt_epochs=epochs,
            seed=seed, device="cpu",
        )  # fmt: skip
        assert result.new_batches == [heldout]
        mapped[epochs] = (result, time.perf_counter() - start)
    # The reference's outputs and every weight of the model: bitwise as before mapping.
    after = correct(model, Xr, br, device="cpu")
    assert all(np.array_equal(a, b) for a, b in zip(before, after, strict=True))
    assert all(torch.equal(weights[k], v) for k, v in model.module.state_dict().items())
    for epochs, (result, map_s) in mapped.items():
        corrected = np.empty_like(bench.X)
        latent = np.empty((len(bench.X), result.latent.shape[1]), dtype=np.float32)
        corrected[ref], latent[ref] = before
        corrected[query], latent[query] = result.corrected, result.latent
        transfer = knn_transfer(latent, bench.labels, query)
        how = "zero-shot" if epochs == 0 else f"adapt {epochs}"
        bench.keep(heldout, f"locusformer mapped {how}", seed, latent)
        for name, res in (
            (f"locusformer mapped {how}", bench.result("locusformer", corrected, None)),
            (f"locusformer_latent mapped {how}", bench.result("locusformer", None, latent)),
        ):
            values = {**bench.score(res, seed), **transfer, "train_s": train_s, "map_s": map_s}
            bench.record(heldout, name, seed, values)


def map_scvi(bench: Bench, heldout: str, seed: int) -> None:
    import anndata as ad
    import scvi

    query = bench.batches == heldout
    ref = ~query

    def counts(rows: np.ndarray) -> ad.AnnData:
        obs = pd.DataFrame({"batch": bench.batches[rows]}, index=bench.obs.index[rows])
        a = ad.AnnData(X=bench.counts.to_numpy(np.float32)[rows], obs=obs)
        a.var_names = bench.counts.columns
        return a

    adata_ref, adata_query = counts(ref), counts(query)
    scvi.settings.seed = seed
    start = time.perf_counter()
    scvi.model.SCVI.setup_anndata(adata_ref, batch_key="batch")
    vae_ref = scvi.model.SCVI(adata_ref, n_latent=10, **ARCHES)
    vae_ref.train(accelerator="cpu", enable_progress_bar=False)
    train_s = time.perf_counter() - start
    z_before = vae_ref.get_latent_representation(adata_ref)
    scvi.settings.seed = seed
    start = time.perf_counter()
    scvi.model.SCVI.prepare_query_anndata(adata_query, vae_ref)
    vae_q = scvi.model.SCVI.load_query_data(adata_query, vae_ref)
    vae_q.train(
        max_epochs=200, plan_kwargs=dict(weight_decay=0.0), accelerator="cpu",
        enable_progress_bar=False,
    )  # fmt: skip
    map_s = time.perf_counter() - start
    latent = np.empty((len(bench.X), 10), dtype=np.float32)
    latent[ref] = vae_q.get_latent_representation(adata_ref)
    latent[query] = vae_q.get_latent_representation(adata_query)
    moved = float(np.abs(latent[ref] - z_before).max())
    print(f"# scVI surgery, {heldout} seed {seed}: reference latent moved by at most {moved:.2e}")
    transfer = knn_transfer(latent, bench.labels, query)
    bench.keep(heldout, "scvi surgery", seed, latent)
    values = {**bench.score(bench.result("scvi", None, latent), seed), **transfer}
    bench.record(heldout, "scvi surgery", seed, {**values, "train_s": train_s, "map_s": map_s})


def run(
    task: str,
    heldouts: list[str],
    seeds: list[int],
    adapt_epochs: int,
    work: Path,
    baselines: bool = True,
    surgery_only: bool = False,
    training: dict | None = None,
) -> None:
    import subprocess

    import torch

    torch.set_num_threads(1)  # the machine is shared
    # Others edit the working tree: say which code this process imported.
    git = ["git", "-C", str(ROOT)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run([*git, "status", "--short", "src"], capture_output=True, text=True)
    print(f"# code: {head.stdout.strip()}, src changes: {dirty.stdout.split() or 'none'}")
    bench = Bench(task, work)
    for seed in seeds:
        done = bench.done()
        last = "harmony de novo" if baselines else "locusformer_latent de novo"
        if not surgery_only and not all((h, last, seed) in done for h in heldouts):
            de_novo(bench, seed, heldouts, baselines, training)
        for heldout in heldouts:
            mapped = (heldout, f"locusformer_latent mapped adapt {adapt_epochs}", seed)
            if not surgery_only and mapped not in done:
                map_locusformer(bench, heldout, seed, adapt_epochs, training)
            if baselines and (heldout, "scvi surgery", seed) not in done:
                map_scvi(bench, heldout, seed)


def table(work: Path, seeds: list[int] | None, heldouts: list[str]) -> None:
    """Markdown tables of results.tsv, the rows of ``seeds`` (all when None) and
    ``heldouts`` only."""
    rows = pd.read_csv(work / "results.tsv", sep="\t", header=None, names=COLUMNS)
    rows = rows.drop_duplicates(["task", "heldout", "method", "seed"], keep="last")
    rows = rows[rows["heldout"].isin(heldouts) & (seeds is None or rows["seed"].isin(seeds))]
    for task, group in rows.groupby("task"):
        agg = group.groupby(["heldout", "method"]).agg(
            seeds=("seed", "nunique"), batch=("batch", "mean"), bio=("bio", "mean"),
            total=("total", "mean"), sd=("total", "std"), acc=("accuracy", "mean"),
            f1=("macro_f1", "mean"), plate_only=("plate_only_share", "mean"),
            absorbed=("absorbed", "mean"), train_s=("train_s", "median"),
            map_s=("map_s", "median"),
        )  # fmt: skip
        for heldout in SETS:
            if heldout in agg.index.get_level_values(0):
                print(f"\n#### {task}, {heldout} held out\n")
                part = agg.loc[heldout].sort_values("total", ascending=False)
                print(part.round(3).to_markdown())
        order = [h for h in SETS if h in agg.index.get_level_values(0)]
        for value in ("total", "acc", "f1"):
            print(f"\n#### {task}: {value} by held-out set (mean over seeds; seeds)\n")
            wide = agg[value].round(3).astype(str) + " (" + agg["seeds"].astype(str) + ")"
            print(wide.unstack(0)[order].fillna("—").to_markdown())
        print(f"\n#### {task}: mean over the held-out sets (seed-means first)\n")
        means = agg.groupby("method")[["total", "acc", "f1", "absorbed"]].mean()
        means["held_out_sets"] = agg.groupby("method").size()
        print(means.sort_values("total", ascending=False).round(3).to_markdown())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--work", type=Path, default=ROOT / "benchmarks" / "out" / "mapping")
    parser.add_argument("--task", default="cellbench5_inner", choices=TASKS)
    parser.add_argument("--heldout", nargs="+", default=list(SETS), choices=list(SETS))
    parser.add_argument("--seeds", nargs="+", type=int, help="default 0; --table: all")
    parser.add_argument("--adapt-epochs", type=int, default=50)
    parser.add_argument("--table", action="store_true", help="print the tables and stop")
    parser.add_argument(
        "--no-baselines", action="store_true",
        help="LocusFormer only (its code changed; the baselines' rows stay as recorded)",
    )  # fmt: skip
    parser.add_argument(
        "--surgery-only", action="store_true",
        help="scVI surgery only (its rows beside mapping_diagnosis.py's LocusFormer runs)",
    )  # fmt: skip
    parser.add_argument(
        "--training", type=json.loads, default=None,
        help="JSON overrides of LocusFormer's training (use a --work of their own)",
    )  # fmt: skip
    args = parser.parse_args()
    if args.table:
        table(args.work, args.seeds, args.heldout)
        return
    prepare([args.task], args.shared, args.work)
    run(
        args.task, args.heldout, args.seeds or [0], args.adapt_epochs, args.work,
        baselines=not args.no_baselines, surgery_only=args.surgery_only, training=args.training,
    )  # fmt: skip


if __name__ == "__main__":
    main()
