"""The ``locusformer`` command line: one subcommand per workflow step.

Each Snakemake rule calls one subcommand, so every step can also be run, debugged and
profiled by hand. Bad input ends with one line on stderr and exit code 2; a system error
(disk full, no permission, out of memory) with one line naming the path and exit code 1;
nothing is written for a step that fails.

Here are each subcommand's handler and :func:`main`; the arguments are in
:mod:`locusformer.cli_parser`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from .cli_parser import build_parser
from .errors import InputError, TrainingDivergedError

log = logging.getLogger("locusformer")

Handler = Callable[[argparse.Namespace], None]
_HANDLERS: dict[str, Handler] = {}


def _command(name: str) -> Callable[[Handler], Handler]:
    def register(handler: Handler) -> Handler:
        _HANDLERS[name] = handler
        return handler

    return register


# -- preprocessing -------------------------------------------------------------------------


@_command("normalize")
def _normalize(args: argparse.Namespace) -> None:
    from .atomic import write_text
    from .io import open_expression, read_samples
    from .parquet import matrix_parquet_writer
    from .preprocess import NormalizeParams, plan_normalization, sample_table
    from .tables import write_tsv

    params = NormalizeParams(
        target_sum=args.target_sum,
        min_samples=args.min_samples,
        n_top_genes=args.n_top_genes,
        hvg_max_samples=args.hvg_max_samples,
        seed=args.seed,
    )
    # An h5ad stays on disk and is read in chunks of rows, more than once; memory holds
    # one chunk, per-sample vectors and the rows that rank highly variable genes.
    with open_expression(
        args.expression, layer=args.layer, held_rows=params.hvg_max_samples
    ) as source:
        sheet, sheet_path = read_samples(args.expression, args.samples, args.sample_column)
        obs = sample_table(
            source.obs_names,
            source.var_names,
            sheet,
            args.batch_key,
            args.label_key,
            matrix_path=args.expression,
            sheet_path=sheet_path,
        )
        plan = plan_normalization(source, obs, args.value_type, args.batch_key, params)
        stats = plan.stats
        genes = source.var_names[plan.genes]
        # Log-expression input has no counts; an empty marker keeps the rule's outputs
        # fixed while telling count-based methods (scVI) that they cannot run.
        count_genes = genes if plan.library is not None else genes[:0]
        with contextlib.ExitStack() as outputs:
            write = outputs.enter_context(matrix_parquet_writer(args.out_matrix, genes))
            write_counts = None
            if args.out_counts:
                write_counts = outputs.enter_context(
                    matrix_parquet_writer(args.out_counts, count_genes)
                )
            for rows, normalized, counts in plan.chunks(source):
                ids = obs.index[rows]
                write(normalized, ids)
                if write_counts is not None:
                    write_counts(counts if counts is not None else normalized[:, :0], ids)
    if args.label_key:
        labels = obs[args.label_key].astype(str).value_counts().sort_index()
        stats["samples_per_label"] = {str(k): int(v) for k, v in labels.items()}
    stats["batch_key"], stats["label_key"] = args.batch_key, args.label_key
    write_tsv(args.out_samples, obs)
    write_text(args.out_stats, json.dumps(stats, indent=2) + "\n")
    log.info(
        "normalized %d samples: %d of %d genes kept",
        stats["n_samples"],
        stats["n_genes_kept"],
        stats["n_genes_input"],
    )


@_command("order-loci")
def _order_loci(args: argparse.Namespace) -> None:
    import pandas as pd

    from .annotation import read_annotation
    from .atomic import write_text
    from .loci import order_loci, shuffle_loci
    from .parquet import iter_matrix_parquet, matrix_parquet_writer, open_matrix_parquet
    from .tables import write_frame_parquet

    handle, genes = open_matrix_parquet(args.matrix)
    handle.close()
    annotation = read_annotation(args.genes, args.gene_id)
    loci, stats = order_loci(
        pd.Index(genes), annotation, args.gene_id, args.unplaced, source=args.genes
    )
    if args.order == "shuffled":
        loci = shuffle_loci(loci, args.seed)
    stats["order"] = args.order
    # Row groups in, row groups out: memory holds one block of rows, whatever the samples.
    # The matrix comes first, so a bad row ends the step before any output exists.
    order = loci["gene_id"].tolist()
    with matrix_parquet_writer(args.out_matrix, pd.Index(order)) as write:
        for block in iter_matrix_parquet(args.matrix, columns=order):
            write(block.to_numpy(), block.index)
            del block  # before the reader's next row group comes
    write_frame_parquet(args.out_loci, loci)
    write_text(args.out_stats, json.dumps(stats, indent=2) + "\n")
    log.info(
        "placed %d of %d loci (%.1f%%), unplaced: %s",
        stats["n_placed"],
        stats["n_genes"],
        100 * stats["share_placed"],
        args.unplaced,
    )


# -- model ---------------------------------------------------------------------------------


@_command("train")
def _train(args: argparse.Namespace) -> None:
    from .steps import run_train

    run_train(
        ordered_path=args.matrix,
        loci_path=args.loci,
        samples_path=args.samples,
        batch_key=args.batch_key,
        params=args.params,
        weights_out=args.out_weights,
        config_out=args.out_config,
        history_out=args.out_history,
        checkpoint_path=args.checkpoint,
        seed=args.seed,
        device=args.device,
        protect=args.protect or (),
        normalize_stats=args.normalize_stats,
    )


@_command("map")
def _map(args: argparse.Namespace) -> None:
    from .mapping import run_map

    run_map(
        args.weights, args.config, args.expression, args.samples, args.batch_key,
        args.out_corrected, args.out_latent, args.out_h5ad, args.out_report,
        value_type=args.value_type, layer=args.layer, sample_column=args.sample_column,
        label_key=args.label_key, reference=args.reference, adapt_epochs=args.adapt_epochs,
        seed=args.seed, device=args.device, model_name=args.model_name,
    )  # fmt: skip


@_command("correct")
def _correct(args: argparse.Namespace) -> None:
    from .correct import run_correct

    run_correct(
        ordered_path=args.matrix,
        samples_path=args.samples,
        batch_key=args.batch_key,
        weights_path=args.weights,
        config_path=args.config,
        corrected_out=args.out_corrected,
        latent_out=args.out_latent,
        h5ad_out=args.out_h5ad,
        reference=args.reference,
        add_residual=args.add_residual,
        chunk_size=args.chunk_size,
        device=args.device,
    )


@_command("attention")
def _attention(args: argparse.Namespace) -> None:
    from .correct import run_attention

    run_attention(
        ordered_path=args.matrix,
        loci_path=args.loci,
        samples_path=args.samples,
        batch_key=args.batch_key,
        weights_path=args.weights,
        config_path=args.config,
        attention_out=args.out,
        device=args.device,
        max_samples=args.max_samples,
    )


@_command("inspect")
def _inspect(args: argparse.Namespace) -> None:
    from .atomic import write_text
    from .trace import dump_trace, format_trace, inspect_model

    result = inspect_model(
        args.model, args.matrix, args.samples, n_samples=args.n_samples,
        sample_column=args.sample_column, seed=args.seed, device=args.device,
    )  # fmt: skip
    text = dump_trace(result) if args.json else format_trace(result, naive=args.naive_rows)
    if args.out:
        write_text(args.out, text)
    else:
        sys.stdout.write(text)
    if args.out_text:  # the same trace as text too: the workflow keeps both forms
        write_text(args.out_text, format_trace(result, naive=args.naive_rows))


# -- scoring and reports -------------------------------------------------------------------


def _pairs(values: Sequence[str] | None, flag: str) -> list[tuple[str, str]]:
    """``["a=x", "a=y"]`` -> ``[("a", "x"), ("a", "y")]`` for repeatable NAME=PATH options."""
    pairs = []
    for value in values or []:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise InputError(flag, f"expected NAME=PATH, got {value!r}")
        pairs.append((name, path))
    return pairs


@_command("baseline")
def _baseline(args: argparse.Namespace) -> None:
    from .baselines import run_baseline

    run_baseline(
        args.method,
        args.matrix,
        args.samples,
        args.batch_key,
        args.label_key,
        args.out,
        seed=args.seed,
        counts_path=args.counts,
        covariates=args.protect or (),
    )


@_command("locusformer-result")
def _locusformer_result(args: argparse.Namespace) -> None:
    from .baselines import display_name
    from .result_rows import open_result, read_element
    from .results import make_result, write_result

    # Only the element this result keeps is read: the whole .h5ad (input, corrected layer
    # and latent) is 16 GB at 1M samples x 2,000 loci.
    corrected = open_result(args.h5ad, "corrected .h5ad")
    keys = [args.batch_key, args.label_key]
    if args.representation == "matrix":
        result = make_result(
            read_element(corrected.path, "layers/corrected", "corrected .h5ad"),
            method=args.method,
            representation="matrix",
            obs=corrected.obs,
            var_names=corrected.var_names,
            batch_key=keys[0],
            label_key=keys[1],
        )
    else:
        result = make_result(
            None,
            method=args.method,
            representation="embedding",
            obs=corrected.obs,
            embedding=read_element(corrected.path, "obsm/X_locusformer", "corrected .h5ad"),
            batch_key=keys[0],
            label_key=keys[1],
        )
    protect = list(corrected.uns.get("locusformer", {}).get("protect", []))
    if protect:  # trained with labels: the report's rows must say so
        result.uns.update(covariates=protect, display_name=display_name(args.method, protect))
    write_result(result, args.out)


@_command("metrics")
def _metrics(args: argparse.Namespace) -> None:
    from .metrics import check_kmeans_starts, run_dataset_metrics
    from .subsample import check_max_samples

    max_samples = check_max_samples(args.max_samples, "--max-samples")
    kmeans_starts = check_kmeans_starts(args.kmeans_starts, "--kmeans-starts")
    pairs = {"--result": _pairs(args.result, "--result"), "--out": _pairs(args.out, "--out")}
    for flag, given in pairs.items():
        names = [name for name, _ in given]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise InputError(flag, f"method(s) given twice: {', '.join(twice)}")
    results, outputs = dict(pairs["--result"]), dict(pairs["--out"])
    run_dataset_metrics(
        results,
        args.uncorrected,
        args.batch_key,
        args.label_key,
        outputs,
        seed=args.seed,
        max_samples=max_samples,
        kmeans_starts=kmeans_starts,
    )


@_command("aggregate-metrics")
def _aggregate(args: argparse.Namespace) -> None:
    from .metrics import aggregate_metrics

    aggregate_metrics(args.tables, args.out)


@_command("summarize")
def _summarize(args: argparse.Namespace) -> None:
    from .metrics import summarize

    benchmarks: dict[tuple[str, str], list[str]] = {}
    for key, path in _pairs(args.benchmark, "--benchmark"):
        dataset, sep, method = key.partition("/")
        if not sep:
            raise InputError("--benchmark", f"expected DATASET/METHOD=PATH, got {key!r}")
        benchmarks.setdefault((dataset, method), []).append(path)
    summarize(dict(_pairs(args.metrics, "--metrics")), benchmarks, args.out)


@_command("confounding")
def _confounding(args: argparse.Namespace) -> None:
    from .confounding import run_confounding

    run_confounding(
        args.matrix, args.samples, args.batch_key, args.label_key, args.out, seed=args.seed
    )


@_command("report")
def _report(args: argparse.Namespace) -> None:
    from .report import render_dataset_report
    from .subsample import check_max_samples

    max_samples = check_max_samples(args.max_samples, "--max-samples")
    benchmarks: dict[str, list[str]] = {}
    for name, path in _pairs(args.benchmark, "--benchmark"):
        benchmarks.setdefault(name, []).append(path)
    render_dataset_report(
        args.out,
        dataset=args.dataset,
        metrics_tsv=args.metrics,
        stats_json=args.stats,
        loci_parquet=args.loci,
        history_tsv=args.history,
        integrated=dict(_pairs(args.result, "--result")),
        attention_npz=args.attention,
        benchmark_files=benchmarks,
        confounding_json=args.confounding,
        mapping_json=args.mapping,
        trace_json=args.trace,
        config=args.config,
        seed=args.seed,
        batch_key=args.batch_key,
        label_key=args.label_key,
        figures_dir=args.figures,
        max_samples=max_samples,
    )


@_command("index")
def _index(args: argparse.Namespace) -> None:
    from .report import render_index

    out_dir = Path(args.out).resolve().parent
    links = {
        name: os.path.relpath(Path(path).resolve(), out_dir)
        for name, path in _pairs(args.report, "--report")
    }
    render_index(
        args.summary, links, args.out, confounding=dict(_pairs(args.confounding, "--confounding"))
    )


# -- simulation ----------------------------------------------------------------------------


@_command("simulate")
def _simulate(args: argparse.Namespace) -> None:
    from .simulate import CountSimulationParams, simulate_counts, write_simulation

    fields = {f.name for f in dataclasses.fields(CountSimulationParams)}
    params = CountSimulationParams(**{k: v for k, v in vars(args).items() if k in fields})
    sim = simulate_counts(params, annotation=args.genes)
    stats = write_simulation(
        sim,
        args.out_expression,
        args.out_samples,
        truth=args.out_truth,
        row=args.out_row,
        name=args.name,
        annotation=args.genes,
        regions=args.out_regions,
    )
    log.info(
        "simulated %d samples x %d genes (%d batches, %d groups), %.1f%% non-zero",
        stats["n_samples"],
        stats["n_genes"],
        params.n_batches,
        params.n_groups,
        100 * stats["nnz"] / max(1, stats["n_samples"] * stats["n_genes"]),
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        _HANDLERS[args.command](args)
    except InputError as exc:
        _error(args.command, str(exc))
        return 2
    except TrainingDivergedError as exc:
        # Valid input, a run gone wrong: a lower learning rate or another seed may help.
        _error(args.command, f"{exc}; try a lower training.lr or another seed")
        return 3
    except OSError as exc:
        # Disk full, no permission, a vanished file: one line that names the path.
        reason = exc.strerror or str(exc) or type(exc).__name__
        _error(args.command, f"{exc.filename}: {reason}" if exc.filename else reason)
        return 1
    except MemoryError:
        _error(args.command, "out of memory; run this step with more memory (resources: mem_mb)")
        return 1
    return 0


def _error(command: str, message: str) -> None:
    message = " ".join(message.split())  # always one line, whatever the cause said
    print(f"locusformer {command}: error: {message}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
