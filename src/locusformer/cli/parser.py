"""The ``locusformer`` command line: one subcommand per workflow step.

This module holds the arguments of every subcommand, what a Snakemake rule passes;
:mod:`locusformer.cli.main` runs them. Building the parser imports nothing heavy (no torch,
anndata or scanpy: choices that come from such modules are spelled out), so that
``locusformer --help`` stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json

from locusformer import __version__

SAMPLES_HELP = (
    "sample sheet (CSV/TSV); optional for an .h5ad whose obs holds the columns (a sheet "
    "given too wins, and a column on which the two disagree is an error)"
)


def _json_arg(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _add_simulate_parser(commands: argparse._SubParsersAction) -> None:
    from locusformer.simulate.params import CountSimulationParams

    defaults = CountSimulationParams()
    p = commands.add_parser(
        "simulate",
        help="write a synthetic multi-batch count data set (counts, sheet, truth)",
        description="Negative-binomial counts of real human genes with cell groups, "
        "batch-specific depth, shifts, scaling and dropout. Writes a samples x genes "
        ".h5ad (sparse, in chunks: any size) or a genes x samples .parquet, the sample "
        "sheet (sample_id, batch, group) and, optionally, the truth and a datasets-sheet row.",
    )
    p.add_argument("--out-expression", required=True, help=".h5ad or .parquet")
    p.add_argument("--out-samples", required=True, help="sample sheet TSV")
    p.add_argument("--out-truth", default=None, help="parameters and drawn structure (JSON)")
    p.add_argument("--out-row", default=None, help="one-row datasets sheet (TSV) naming them")
    p.add_argument("--name", default="simulated", help="dataset name in --out-row")
    p.add_argument("--genes", default=None, help="gene table (default: bundled coordinates)")
    p.add_argument(
        "--out-regions",
        default=None,
        help="segments of a regional batch effect and each batch's shift and scale (TSV)",
    )
    for field in dataclasses.fields(CountSimulationParams):
        flag = "--" + field.name.replace("_", "-")
        default = getattr(defaults, field.name)
        kind = type(default) if isinstance(default, int | str) else float
        help_ = f"{field.metadata.get('help', '')} (default {default})"
        p.add_argument(
            flag, type=kind, default=default, choices=field.metadata.get("choices"), help=help_
        )


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``locusformer``: one subcommand per handler of :mod:`locusformer.cli.main`."""
    parser = argparse.ArgumentParser(prog="locusformer", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"locusformer {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_preprocessing(commands)
    _add_training(commands)
    _add_applying(commands)
    _add_inspection(commands)
    _add_scoring(commands)
    _add_reporting(commands)
    _add_simulate_parser(commands)
    return parser


def _add_preprocessing(commands: argparse._SubParsersAction) -> None:
    """Reading and normalizing the data, and placing its genes on the genome."""
    p = commands.add_parser("normalize", help="read, validate, normalize and select genes")
    p.add_argument("--expression", required=True, help="matrix (CSV/TSV[.gz], parquet, h5ad)")
    p.add_argument("--layer", default=None, help="h5ad layer holding the values (default .X)")
    p.add_argument("--samples", default=None, help=SAMPLES_HELP)
    p.add_argument("--sample-column", default=None, help="sample id column of the sheet")
    p.add_argument("--batch-key", required=True)
    p.add_argument("--label-key", default=None)
    p.add_argument("--value-type", required=True, choices=["counts", "log_expression"])
    p.add_argument("--target-sum", type=float, default=1e4)
    p.add_argument("--min-samples", type=int, default=3)
    p.add_argument("--n-top-genes", type=int, default=2000)
    p.add_argument(
        "--hvg-max-samples",
        type=int,
        default=100_000,
        help="rank highly variable genes on a seeded subsample of this many samples at most",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of that subsample")
    p.add_argument("--out-matrix", required=True)
    p.add_argument("--out-counts", default=None)
    p.add_argument("--out-samples", required=True)
    p.add_argument("--out-stats", required=True)

    p = commands.add_parser(
        "counts", help="the raw counts of the genes and samples normalize kept (for scVI)"
    )
    p.add_argument("--expression", required=True, help="matrix (CSV/TSV[.gz], parquet, h5ad)")
    p.add_argument("--layer", default=None, help="h5ad layer holding the values (default .X)")
    p.add_argument("--value-type", required=True, choices=["counts", "log_expression"])
    p.add_argument("--matrix", required=True, help="normalized.parquet")
    p.add_argument("--out", required=True)

    p = commands.add_parser("order-loci", help="place genes on the genome and reorder")
    p.add_argument("--matrix", required=True, help="normalized.parquet")
    p.add_argument("--genes", required=True, help="annotation (TSV, GTF or BED)")
    p.add_argument("--gene-id", required=True, help="annotation column matching matrix ids")
    p.add_argument("--unplaced", default="append", choices=["append", "drop"])
    p.add_argument(
        "--order", default="genomic", choices=["genomic", "shuffled"], help="shuffled: ablation"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the shuffled order")
    p.add_argument("--out-loci", required=True)
    p.add_argument("--out-matrix", required=True)
    p.add_argument("--out-stats", required=True)


def _add_training(commands: argparse._SubParsersAction) -> None:
    """Training the corrector."""
    p = commands.add_parser("train", help="train the attention corrector")
    p.add_argument("--matrix", required=True, help="ordered.parquet")
    p.add_argument("--loci", required=True)
    p.add_argument("--samples", required=True)
    p.add_argument("--batch-key", required=True)
    p.add_argument("--params", type=_json_arg, default={}, help='JSON: {"model":..,"train":..}')
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--checkpoint", default=None, help="resumable checkpoint file")
    p.add_argument("--out-weights", required=True)
    p.add_argument("--out-config", required=True)
    p.add_argument("--out-history", required=True)
    p.add_argument(
        "--protect",
        action="append",
        metavar="COLUMN",
        help="sample-sheet column of biology to keep: batch is removed within its levels",
    )
    p.add_argument(
        "--normalize-stats",
        default=None,
        help="the normalize step's stats JSON, recorded in the model so that map prepares "
        "new data the same way",
    )


def _add_applying(commands: argparse._SubParsersAction) -> None:
    """Applying a trained corrector: to new data (map) or to the data it was trained on."""
    p = commands.add_parser("map", help="map new data onto a trained corrector")
    p.add_argument("--weights", required=True, help="model.pt of a trained model")
    p.add_argument("--config", required=True, help="model.json of that model")
    p.add_argument("--expression", required=True, help="matrix (CSV/TSV[.gz], parquet, h5ad)")
    p.add_argument("--layer", default=None, help="h5ad layer holding the values (default .X)")
    p.add_argument("--samples", default=None, help=SAMPLES_HELP)
    p.add_argument("--sample-column", default=None, help="sample id column of the sheet")
    p.add_argument("--batch-key", required=True)
    p.add_argument("--label-key", default=None)
    p.add_argument(
        "--value-type",
        default=None,
        choices=["counts", "log_expression"],
        help="default: what the model was trained on",
    )
    p.add_argument("--reference", default="mean", help="a trained batch, or mean")
    p.add_argument(
        "--adapt-epochs",
        type=int,
        default=0,
        help="epochs adapting new batches' own parameters, the model frozen (0: zero-shot)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--out-corrected", required=True)
    p.add_argument("--out-latent", required=True)
    p.add_argument("--out-h5ad", default=None)
    p.add_argument("--out-report", required=True, help="JSON: genes, new batches, adaptation")
    p.add_argument(
        "--model-name", default=None, help="the model's name in the report (default: its folder)"
    )

    p = commands.add_parser("correct", help="apply a trained corrector")
    p.add_argument("--matrix", required=True, help="ordered.parquet")
    p.add_argument("--samples", required=True)
    p.add_argument("--batch-key", required=True)
    p.add_argument("--weights", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--reference", default="mean", help="a batch name, or mean")
    p.add_argument("--add-residual", action="store_true")
    p.add_argument("--chunk-size", type=int, default=64)  # correct.CHUNK_SIZE, without torch
    p.add_argument("--device", default="auto")
    p.add_argument("--out-corrected", required=True)
    p.add_argument("--out-latent", required=True)
    p.add_argument("--out-h5ad", required=True)


def _add_inspection(commands: argparse._SubParsersAction) -> None:
    """Looking into a trained corrector's attention."""
    p = commands.add_parser("attention", help="mean attention map of a trained corrector")
    p.add_argument("--matrix", required=True, help="ordered.parquet")
    p.add_argument("--loci", required=True)
    p.add_argument("--samples", required=True)
    p.add_argument("--batch-key", required=True)
    p.add_argument("--weights", required=True)
    p.add_argument("--config", required=True)
    p.add_argument("--max-samples", type=int, default=256)
    p.add_argument("--device", default="auto")
    p.add_argument("--out", required=True)

    p = commands.add_parser(
        "inspect",
        help="trace a trained model's attention step by step (shapes, ranges, non-finite)",
        description="Per layer and head: Q, K, V, the scores before and after scaling, "
        "the softmax (row sums, entropy), the first non-finite step, and where a softmax "
        "without the row max subtracted would overflow; in float32 and bfloat16 (on the "
        "CPU simulated by casting), with the largest difference between them.",
    )
    p.add_argument("--model", required=True, help="folder of a trained model (model.pt, .json)")
    p.add_argument("--matrix", required=True, help="ordered.parquet: the model's genes, in order")
    p.add_argument(
        "--samples",
        default=None,
        help="sample sheet: trace its first --n-samples samples (default: the matrix's first rows)",
    )
    p.add_argument("--sample-column", default=None, help="sample id column of the sheet")
    p.add_argument("--n-samples", type=int, default=4)
    p.add_argument(
        "--seed",
        type=int,
        default=None,
        help="draw the --n-samples at random with this seed (default: the first ones)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--json", action="store_true", help="JSON for machines instead of text")
    p.add_argument("--naive-rows", action="store_true", help="list the naive softmax's steps too")
    p.add_argument("--out", default=None, help="write the trace here (default: stdout)")
    p.add_argument("--out-text", default=None, help="also write the trace as text here")


def _add_scoring(commands: argparse._SubParsersAction) -> None:
    """The established methods' results and LocusFormer's, and their scores."""
    p = commands.add_parser("baseline", help="run an established method on the data")
    # baselines.METHODS, spelled out so that --help does not import numpy and anndata
    p.add_argument(
        "--method",
        required=True,
        choices=["uncorrected", "combat", "combat_mod", "harmony", "scvi", "sysvi"],
    )
    p.add_argument("--matrix", required=True, help="ordered.parquet")
    p.add_argument("--samples", required=True)
    p.add_argument("--counts", default=None, help="counts.parquet (scVI)")
    p.add_argument(
        "--protect",
        action="append",
        metavar="COLUMN",
        help="sample-sheet column whose effect combat_mod keeps (repeatable; combat_mod only)",
    )
    p.add_argument("--batch-key", required=True)
    p.add_argument("--label-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", required=True)

    p = commands.add_parser("locusformer-result", help="LocusFormer output as a scored result")
    p.add_argument("--h5ad", required=True, help="locusformer.h5ad from correct")
    p.add_argument("--method", required=True)
    p.add_argument("--representation", required=True, choices=["matrix", "embedding"])
    p.add_argument("--batch-key", required=True)
    p.add_argument("--label-key", default=None)
    p.add_argument("--out", required=True)

    p = commands.add_parser("metrics", help="scIB metrics of a dataset's methods, one process")
    p.add_argument("--result", action="append", required=True, help="METHOD=result.h5ad")
    p.add_argument("--uncorrected", required=True, help="the uncorrected result.h5ad")
    p.add_argument("--batch-key", required=True)
    p.add_argument("--label-key", default=None)
    p.add_argument("--seed", type=int, default=0, help="seed of the PCA and of the subsample")
    p.add_argument(
        "--max-samples",
        default=50_000,  # subsample.DEFAULT_MAX_SAMPLES; checked there, refused in one line
        help="above this many samples, score every method on one subsample of this many, "
        "stratified by batch and label (default 50000)",
    )
    p.add_argument(
        "--kmeans-starts",
        default=10,  # metrics.DEFAULT_KMEANS_STARTS; checked by check_kmeans_starts
        help="k-means++ starts behind KMeans NMI and ARI, the lowest-inertia one kept "
        "(default 10; 1: scib-metrics' own single start)",
    )
    p.add_argument("--out", action="append", required=True, help="METHOD=metrics.tsv")
    p.add_argument(
        "--out-representations",
        default=None,
        help="also write each method's scored representation here (.h5ad), for the report",
    )

    p = commands.add_parser("aggregate-metrics", help="one dataset's metrics.tsv")
    p.add_argument("tables", nargs="+")
    p.add_argument("--out", required=True)

    p = commands.add_parser("summarize", help="summary.tsv over all datasets")
    p.add_argument("--metrics", action="append", help="DATASET=metrics.tsv", required=True)
    p.add_argument("--benchmark", action="append", help="DATASET/METHOD=benchmark.tsv")
    p.add_argument("--out", required=True)


def _add_reporting(commands: argparse._SubParsersAction) -> None:
    """The design check, each dataset's report and the index over all of them."""
    p = commands.add_parser("confounding", help="how strongly batch predicts biology (JSON)")
    p.add_argument("--matrix", required=True, help="normalized.parquet")
    p.add_argument("--samples", required=True, help="samples.tsv")
    p.add_argument("--batch-key", required=True)
    p.add_argument("--label-key", default=None)
    p.add_argument("--seed", type=int, default=0, help="seed of the PCA and its subsample")
    p.add_argument("--out", required=True)

    p = commands.add_parser("report", help="one dataset's self-contained HTML report")
    p.add_argument("--dataset", required=True)
    p.add_argument("--metrics", required=True, help="metrics.tsv")
    p.add_argument("--stats", default=None, help="normalize statistics JSON")
    p.add_argument("--loci", default=None, help="loci.parquet")
    p.add_argument("--history", default=None, help="training history TSV")
    p.add_argument("--result", action="append", help="METHOD=integrated.h5ad")
    p.add_argument(
        "--representations",
        default=None,
        help="representations.h5ad of metrics: the embeddings drawn from what was scored",
    )
    p.add_argument("--attention", default=None, help="attention map .npz")
    p.add_argument("--benchmark", action="append", help="RULE=benchmark.tsv")
    p.add_argument("--confounding", default=None, help="confounding.json (design check)")
    p.add_argument("--mapping", default=None, help="mapping.json of map (a mapped dataset)")
    p.add_argument("--trace", default=None, help="inspect.json of inspect --json (the trace)")
    p.add_argument("--config", type=_json_arg, default={}, help="the run's configuration (JSON)")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--batch-key", required=True)
    p.add_argument("--label-key", default=None)
    p.add_argument("--figures", default=None, help="also write each figure here as PNG")
    p.add_argument(
        "--max-samples",
        default=50_000,  # subsample.DEFAULT_MAX_SAMPLES, as for metrics
        help="above this many samples, draw the embeddings from the subsample the metrics "
        "scored (metrics --max-samples with the same --seed; default 50000)",
    )
    p.add_argument("--out", required=True)

    p = commands.add_parser("index", help="results/index.html over all datasets")
    p.add_argument("--summary", required=True)
    p.add_argument("--report", action="append", required=True, help="DATASET=report.html")
    p.add_argument("--confounding", action="append", help="DATASET=confounding.json")
    p.add_argument("--out", required=True)
