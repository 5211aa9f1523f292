"""The ``locusformer`` command line: one subcommand per workflow step.

Each Snakemake rule calls one subcommand, so every step can also be run, debugged and
profiled by hand. Bad input ends with one line on stderr and exit code 2; a system error
(disk full, no permission, out of memory) with one line naming the path and exit code 1;
nothing is written for a step that fails.

Here are each subcommand's handler and :func:`main`; the arguments are in
:mod:`locusformer.cli.parser`.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
from collections.abc import Callable, Sequence

from locusformer.cli.parser import build_parser
from locusformer.errors import InputError, TrainingDivergedError
from locusformer.io.atomic import temporaries_removed_on_sigterm

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
    from locusformer.pp.normalize import NormalizeParams
    from locusformer.steps.normalize import run_normalize

    params = NormalizeParams(
        target_sum=args.target_sum,
        min_samples=args.min_samples,
        n_top_genes=args.n_top_genes,
        hvg_max_samples=args.hvg_max_samples,
        seed=args.seed,
    )
    run_normalize(
        args.expression,
        params,
        batch_key=args.batch_key,
        value_type=args.value_type,
        out_matrix=args.out_matrix,
        out_samples=args.out_samples,
        out_stats=args.out_stats,
        out_counts=args.out_counts,
        samples=args.samples,
        sample_column=args.sample_column,
        layer=args.layer,
        label_key=args.label_key,
    )


@_command("counts")
def _counts(args: argparse.Namespace) -> None:
    from locusformer.steps.counts import run_counts

    run_counts(
        args.expression,
        args.matrix,
        value_type=args.value_type,
        out=args.out,
        layer=args.layer,
    )


@_command("order-loci")
def _order_loci(args: argparse.Namespace) -> None:
    from locusformer.steps.order_loci import run_order_loci

    run_order_loci(
        matrix=args.matrix,
        annotation_path=args.genes,
        gene_id=args.gene_id,
        unplaced=args.unplaced,
        order=args.order,
        seed=args.seed,
        out_matrix=args.out_matrix,
        out_loci=args.out_loci,
        out_stats=args.out_stats,
    )


# -- model ---------------------------------------------------------------------------------


@_command("train")
def _train(args: argparse.Namespace) -> None:
    from locusformer.steps.train import run_train

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
    from locusformer.steps.map import run_map

    run_map(
        args.weights,
        args.config,
        args.expression,
        args.samples,
        batch_key=args.batch_key,
        corrected_out=args.out_corrected,
        latent_out=args.out_latent,
        h5ad_out=args.out_h5ad,
        report_out=args.out_report,
        value_type=args.value_type,
        layer=args.layer,
        sample_column=args.sample_column,
        label_key=args.label_key,
        reference=args.reference,
        adapt_epochs=args.adapt_epochs,
        seed=args.seed,
        device=args.device,
        model_name=args.model_name,
    )


@_command("correct")
def _correct(args: argparse.Namespace) -> None:
    from locusformer.steps.correct import run_correct

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
    from locusformer.steps.attention import run_attention

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
    from locusformer.steps.inspect import run_inspect

    run_inspect(
        model=args.model,
        matrix=args.matrix,
        samples=args.samples,
        n_samples=args.n_samples,
        sample_column=args.sample_column,
        seed=args.seed,
        device=args.device,
        json=args.json,
        naive_rows=args.naive_rows,
        out=args.out,
        out_text=args.out_text,
    )


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
    from locusformer.steps.baseline import run_baseline

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
    from locusformer.steps.result import run_locusformer_result

    run_locusformer_result(
        h5ad=args.h5ad,
        batch_key=args.batch_key,
        label_key=args.label_key,
        representation=args.representation,
        method=args.method,
        out=args.out,
    )


@_command("metrics")
def _metrics(args: argparse.Namespace) -> None:
    from locusformer.scoring.metrics import check_kmeans_starts
    from locusformer.scoring.subsample import check_max_samples
    from locusformer.steps.metrics import run_dataset_metrics

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
        out_representations=args.out_representations,
    )


@_command("aggregate-metrics")
def _aggregate(args: argparse.Namespace) -> None:
    from locusformer.steps.aggregate import aggregate_metrics

    aggregate_metrics(args.tables, args.out)


@_command("summarize")
def _summarize(args: argparse.Namespace) -> None:
    from locusformer.steps.summarize import summarize

    benchmarks: dict[tuple[str, str], list[str]] = {}
    for key, path in _pairs(args.benchmark, "--benchmark"):
        dataset, sep, method = key.partition("/")
        if not sep:
            raise InputError("--benchmark", f"expected DATASET/METHOD=PATH, got {key!r}")
        benchmarks.setdefault((dataset, method), []).append(path)
    summarize(dict(_pairs(args.metrics, "--metrics")), benchmarks, args.out)


@_command("confounding")
def _confounding(args: argparse.Namespace) -> None:
    from locusformer.steps.confounding import run_confounding

    run_confounding(
        args.matrix, args.samples, args.batch_key, args.label_key, args.out, seed=args.seed
    )


@_command("report")
def _report(args: argparse.Namespace) -> None:
    from locusformer.steps.report import run_report

    benchmarks: dict[str, list[str]] = {}
    for name, path in _pairs(args.benchmark, "--benchmark"):
        benchmarks.setdefault(name, []).append(path)
    run_report(
        args.out,
        dataset=args.dataset,
        metrics=args.metrics,
        integrated=dict(_pairs(args.result, "--result")),
        representations=args.representations,
        benchmarks=benchmarks,
        max_samples=args.max_samples,
        stats_json=args.stats,
        loci_parquet=args.loci,
        history_tsv=args.history,
        attention_npz=args.attention,
        confounding_json=args.confounding,
        mapping_json=args.mapping,
        trace_json=args.trace,
        config=args.config,
        seed=args.seed,
        batch_key=args.batch_key,
        label_key=args.label_key,
        figures_dir=args.figures,
    )


@_command("index")
def _index(args: argparse.Namespace) -> None:
    from locusformer.steps.index import run_index

    run_index(
        args.summary,
        dict(_pairs(args.report, "--report")),
        args.out,
        confounding=dict(_pairs(args.confounding, "--confounding")),
    )


# -- simulation ----------------------------------------------------------------------------


@_command("simulate")
def _simulate(args: argparse.Namespace) -> None:
    from locusformer.simulate.params import CountSimulationParams
    from locusformer.steps.simulate import run_simulate

    fields = {f.name for f in dataclasses.fields(CountSimulationParams)}
    params = CountSimulationParams(**{k: v for k, v in vars(args).items() if k in fields})
    run_simulate(
        params,
        out_expression=args.out_expression,
        out_samples=args.out_samples,
        genes=args.genes,
        out_truth=args.out_truth,
        out_row=args.out_row,
        out_regions=args.out_regions,
        name=args.name,
    )


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        with temporaries_removed_on_sigterm():
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
