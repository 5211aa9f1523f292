import json
import os
import shlex
import sys
from pathlib import Path

import jsonschema
import pandas as pd
from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

# Jobs run `python -m locusformer` from the workflow's own src/, so results never depend
# on which locusformer happens to be installed in the environment (venv, conda env or
# cluster node) that runs a job. src/ is found from this file, which is right also when
# another workflow uses this one as a module (workflow.basedir is then that workflow's
# folder). Jobs inherit this process's environment, and a job on a cluster node parses
# this file again, so the path is set there too. Snakemake starts jobs in a conda env
# (--sdm conda) without PYTHONPATH: every command starts with
# PYTHONPATH=${PYTHONPATH-$LOCUSFORMER_SRC}, the path set here, or src/ alone in a conda
# env. Without src/ beside the workflow (a deployment: the module snakedeploy reads from
# GitHub, or a copy of workflow/ alone) SRC is empty and the installed package runs: `pip
# install "locusformer[workflow]"` where Snakemake runs, or, under --sdm conda, the one
# each stage env installs after it is built (workflow/envs/*.post-deploy.sh).
SRC = str(
    Path(workflow.current_basedir.get_path_or_uri(secret_free=True)).parents[1] / "src"
)
if not Path(SRC, "locusformer", "__main__.py").is_file():
    SRC = ""
_inherited = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p != SRC]
os.environ.update(PYTHONPATH=os.pathsep.join(filter(None, [SRC, *_inherited])))
os.environ.update(LOCUSFORMER_SRC=SRC)
# `python` in a job is the interpreter running Snakemake (so a venv works without being
# activated), unless a rule's conda env is activated, which puts its own python first.
os.environ.update(
    PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
)
# This process reads the datasets sheet with the same src/, installed or not.
if SRC and SRC not in sys.path:
    sys.path.insert(0, SRC)


def refuse(message):
    """Stop before any job runs, with one line (exit code 1), like the steps' own errors."""
    raise SystemExit(f"locusformer workflow: error: {' '.join(str(message).split())}")


try:
    from locusformer.errors import InputError
    from locusformer.io.sheets import (
        check_finite_numbers,
        check_protected_columns,
        check_samples,
        given,
        load_schema,
        model_sources,
        name_pattern,
        read_datasets,
        schema_error,
    )
except ImportError as e:
    # A deployment has no src/ beside the workflow: the package must be installed.
    refuse(
        f"cannot import the locusformer package ({e}): a workflow without src/ beside it"
        f" runs the installed one (pip install 'locusformer[workflow]')"
    )


def validated(data, schema, source):
    """``validate`` (which fills in the defaults), its complaint as one line naming the key.

    Snakemake's own message spreads the schema over a dozen lines.
    """
    try:
        validate(data, schema=schema)
    except WorkflowError as e:
        error = e.__context__  # Snakemake raises WorkflowError while handling it
        if not isinstance(error, jsonschema.ValidationError):
            raise
        refuse(schema_error(source, error))


validated(config, "../schemas/config.schema.yaml", "config")
try:
    check_finite_numbers(config)
except InputError as e:
    refuse(e)

# The datasets sheet, read and checked by locusformer.io.sheets (a deploying workflow's
# skip_validation skips its schema, as it does the config's).
try:
    DATASETS = read_datasets(
        config["datasets"],
        (
            None
            if workflow.modifier.skip_validation
            else load_schema(workflow.source_path("../schemas/datasets.schema.yaml"))
        ),
    )
    check_samples(DATASETS, config["datasets"])
    check_protected_columns(DATASETS, config["protect"], config["datasets"])
    # Datasets mapped onto a trained model (`locusformer map`) and the ones trained here.
    MODEL_SOURCES = model_sources(DATASETS, config["datasets"])
except InputError as e:
    refuse(e)
SEED = config["seed"]
TRAINED = [name for name in DATASETS.index if name not in MODEL_SOURCES]
MAPPED = [name for name in DATASETS.index if name in MODEL_SOURCES]


wildcard_constraints:
    dataset=name_pattern(DATASETS.index),


# A dataset's corrected outputs (corrected.parquet, latent.parquet, locusformer.h5ad) come
# from `correct` for a trained dataset and from `map` for a mapped one: each rule's
# wildcard constraint names its datasets, so every output has one rule that can make it.
TRAINED_PATTERN = name_pattern(TRAINED)
MAPPED_PATTERN = name_pattern(MAPPED)


def dataset(wildcards):
    return DATASETS.loc[wildcards.dataset]


def optional(value, flag):
    """``--flag value`` (shell-quoted) when value is set, else nothing."""
    if value is None or pd.isna(value) or value == "":
        return ""
    return f"{flag} {shlex.quote(str(value))}"


def sheet_path(path):
    """A file named by the datasets sheet, relative to the working directory even when a
    deploying workflow gives this one a ``prefix:`` (which Snakemake puts before every
    relative input path); ``local`` also keeps a default storage provider off it.

    ``resources/…`` that the working directory lacks is the workflow's own copy
    (workflow/resources/: the demo and the human gene coordinates): a deployment's sheet
    names them as the repository's does, and snakedeploy copies config/ only."""
    return local(shipped(path) or path)


# The workflow's own folder (workflow/), on disk or read from GitHub: resources/ ships in it.
WORKFLOW_SOURCE = workflow.current_basedir.join("..")


def shipped(path):
    """The workflow's copy of ``resources/…`` when the working directory has no such file:
    its path on disk, or for a workflow read from GitHub the copy in Snakemake's source
    cache (which holds text files only: a compressed one must be put in resources/)."""
    parts = Path(path).parts
    if len(parts) < 2 or parts[0] != "resources" or Path(path).exists():
        return None
    source = WORKFLOW_SOURCE.join(path)
    # On disk but missing there too: None, and Snakemake says the input is missing.
    if source.is_local:
        copy = os.path.abspath(source.get_path_or_uri(secret_free=True))
        return copy if Path(copy).is_file() else None
    try:
        return workflow.sourcecache.get_path(source)
    except Exception as e:
        raise WorkflowError(
            f"{path} is not in the working directory and the workflow's copy ({source})"
            f" cannot be read ({type(e).__name__}): put it in resources/ here"
        )


def get_expression(wildcards):
    return sheet_path(dataset(wildcards)["expression"])


def get_samples(wildcards):
    """The sample sheet, or nothing for an .h5ad whose obs holds the columns."""
    samples = given(dataset(wildcards), "samples")
    return [] if samples is None else sheet_path(samples)


def get_samples_arg(wildcards, input):
    return f"--samples {shlex.quote(input.samples)}" if input.samples else ""


def get_genes(wildcards):
    return sheet_path(dataset(wildcards)["genes"])


def get_normalize_args(wildcards):
    row = dataset(wildcards)
    return " ".join(
        [
            f"--batch-key {shlex.quote(row['batch_key'])}",
            optional(row.get("label_key"), "--label-key"),
            optional(row.get("layer"), "--layer"),
            optional(row.get("sample_column"), "--sample-column"),
            f"--value-type {row['value_type']}",
        ]
    )


def get_batch_key(wildcards):
    return shlex.quote(dataset(wildcards)["batch_key"])


def get_gene_id(wildcards):
    return shlex.quote(dataset(wildcards)["gene_id"])


def get_train_params():
    return shlex.quote(
        json.dumps({"model": config["model"], "train": config["training"]})
    )


def get_train_launcher(wildcards):
    """``training.devices`` > 1: one process per device under torchrun (DDP); else one.

    The job's threads are not part of this parameter: a different ``--cores`` must not
    count as a change that reruns training.
    """
    devices = int(config["training"].get("devices", 1))
    if devices > 1:
        return (
            "python -m torch.distributed.run --standalone"
            f" --nproc-per-node {devices} -m locusformer"
        )
    return "python -m locusformer"


def get_train_protect_arg():
    """``--protect COLUMN`` per protected column: LocusFormer removes batch within them."""
    return " ".join(f"--protect {shlex.quote(c)}" for c in config["protect"])


def model_folder(name):
    """The folder of the trained model behind a dataset's LocusFormer results."""
    kind, where = MODEL_SOURCES.get(name, ("dataset", name))
    return f"results/{where}/model" if kind == "dataset" else where


def get_model_files(wildcards):
    """model.pt and model.json that `map` applies: another dataset's train outputs (so
    that dataset is trained first) or those of a folder named in the sheet."""
    kind, where = MODEL_SOURCES[wildcards.dataset]
    files = {"weights": "model.pt", "config": "model.json"}
    if kind == "dataset":
        return {k: f"results/{where}/model/{f}" for k, f in files.items()}
    return {k: sheet_path(str(Path(where, f))) for k, f in files.items()}


def get_map_args(wildcards):
    row = dataset(wildcards)
    kind, where = MODEL_SOURCES[wildcards.dataset]
    return " ".join(
        [
            f"--batch-key {shlex.quote(row['batch_key'])}",
            optional(row.get("label_key"), "--label-key"),
            optional(row.get("layer"), "--layer"),
            f"--value-type {row['value_type']}",
            f"--model-name {shlex.quote(where)}",
        ]
    )


# Samples of a trained dataset that `inspect` traces its model on (seeded by SEED).
INSPECT_SAMPLES = 8

# Of the jobs ready, Snakemake starts the highest priority first. On a few cores (the demo
# on 2) the chain the report waits for, normalize -> order_loci -> train (or map) ->
# correct -> locusformer_result -> metrics -> aggregate_metrics -> report -> index, goes
# first, and the jobs beside it (confounding, attention_map, inspect, summarize) take the
# cores it leaves free. The baselines come between: metrics waits for them too.
CHAIN_PRIORITY = 2
BASELINE_PRIORITY = 1


def get_final_outputs():
    return [
        *expand(
            ["results/{dataset}/corrected.parquet", "results/{dataset}/latent.parquet"],
            dataset=DATASETS.index,
        ),
        "results/summary.tsv",
        "results/index.html",
    ]


BASELINES = ["uncorrected", *config["baselines"]]
# Without a column to keep, combat_mod would be plain ComBat under another name: stop
# before any job runs rather than after every dataset is normalized.
if "combat_mod" in config["baselines"] and not config["protect"]:
    refuse(
        "config: baselines lists combat_mod, but protect names no sample-sheet column"
        " whose effect it keeps (e.g. protect: [cell_line])"
    )
# LocusFormer is scored twice: its corrected matrix and its batch-free latent.
LOCUSFORMER_METHODS = {"locusformer": "matrix", "locusformer_latent": "embedding"}


def methods():
    return [*BASELINES, *LOCUSFORMER_METHODS]


def get_baseline_threads(wildcards):
    """One thread for the baselines that are matrix algebra (``uncorrected`` copies its
    input; ComBat and Harmony are a few seconds on the demo): on a few cores they run two
    at a time beside each other or a side job, instead of each waiting for both cores
    while one-thread side jobs take the first core freed. scVI and SysVI train networks,
    which use a second thread."""
    return 2 if wildcards.method in ("scvi", "sysvi") else 1


def get_baseline_input(wildcards):
    """The ordered matrix and the sample table; the raw counts too for scVI, the one
    baseline that models them (the counts job runs only then)."""
    files = {
        "matrix": f"results/{wildcards.dataset}/ordered.parquet",
        "samples": f"results/{wildcards.dataset}/samples.tsv",
    }
    if wildcards.method == "scvi":
        files["counts"] = f"results/{wildcards.dataset}/counts.parquet"
    return files


def get_counts_source_args(wildcards):
    row = dataset(wildcards)
    return " ".join(
        [optional(row.get("layer"), "--layer"), f"--value-type {row['value_type']}"]
    )


def get_label_arg(wildcards):
    return optional(dataset(wildcards).get("label_key"), "--label-key")


def get_counts_arg(wildcards, input):
    return f"--counts {shlex.quote(input.counts)}" if wildcards.method == "scvi" else ""


def get_protect_arg(wildcards):
    """``--protect COLUMN`` per column combat_mod keeps; nothing for the other methods."""
    if wildcards.method != "combat_mod":
        return ""
    return " ".join(f"--protect {shlex.quote(c)}" for c in config["protect"])


def get_method_tables(wildcards):
    return expand("results/{{dataset}}/metrics/{method}.tsv", method=methods())


def get_metrics_inputs(wildcards):
    """Every method's result (methods() order) and the uncorrected one, scored against."""
    name = wildcards.dataset
    return {
        "results": [f"results/{name}/integrated/{m}.h5ad" for m in methods()],
        "uncorrected": f"results/{name}/integrated/uncorrected.h5ad",
    }


def get_metrics_results(wildcards, input):
    return " ".join(
        f"--result {shlex.quote(f'{m}={path}')}"
        for m, path in zip(methods(), input.results, strict=True)
    )


def get_metrics_outputs(wildcards, output):
    return " ".join(
        f"--out {shlex.quote(f'{m}={path}')}"
        for m, path in zip(methods(), output.tables, strict=True)
    )


def benchmark_table(name, step):
    """Where the job of ``step`` on dataset ``name`` writes its time and memory."""
    return f"logs/benchmarks/{name}/{step}.tsv"


def get_benchmarks():
    """``DATASET/METHOD=benchmark.tsv`` pairs: the rules whose time a method costs."""
    pairs = []
    for name in DATASETS.index:
        for method in BASELINES:
            pairs.append((name, method, benchmark_table(name, f"baseline_{method}")))
        for method in LOCUSFORMER_METHODS:
            for step in locusformer_steps(name):
                pairs.append((name, method, benchmark_table(name, step)))
    return pairs


def locusformer_steps(name):
    """The rules that make a dataset's LocusFormer results: mapped, the model exists."""
    return ["map"] if name in MODEL_SOURCES else ["train", "correct"]


REPORT_STEPS = [
    "normalize",
    "confounding",
    "order_loci",
    "train",
    "correct",
    "attention_map",
    "inspect",
]


def report_steps(name):
    if name in MODEL_SOURCES:
        model_steps = ("train", "correct", "attention_map", "inspect")
        return [step for step in REPORT_STEPS if step not in model_steps] + ["map"]
    return REPORT_STEPS


def get_report_inputs(wildcards):
    name = wildcards.dataset
    inputs = {
        "metrics": f"results/{name}/metrics.tsv",
        "representations": f"results/{name}/metrics/representations.h5ad",
        "stats": f"results/{name}/stats/normalize.json",
        "confounding": f"results/{name}/confounding.json",
        "loci": f"results/{name}/loci.parquet",
        "history": f"results/{name}/model/history.tsv",
        "attention": f"results/{name}/model/attention.npz",
        "trace": f"results/{name}/inspect.json",
        "results": [f"results/{name}/integrated/{m}.h5ad" for m in methods()],
        "benchmarks": [path for _, path in report_benchmarks(name)],
    }
    if name in MODEL_SOURCES:
        # Mapped: the training curves are the model's; its attention maps and its trace
        # were made on other data, so the report has neither.
        del inputs["attention"], inputs["trace"]
        kind, where = MODEL_SOURCES[name]
        inputs["history"] = f"results/{where}/model/history.tsv"
        if kind == "folder":
            history = Path(where, "history.tsv")
            inputs["history"] = sheet_path(str(history)) if history.is_file() else []
        inputs["mapping"] = f"results/{name}/mapping.json"
    return inputs


def get_report_model_args(wildcards, input):
    """--history, --attention, --trace and --mapping, for the inputs this dataset's report
    has."""
    flags = {
        "history": "--history",
        "attention": "--attention",
        "trace": "--trace",
        "mapping": "--mapping",
    }
    return " ".join(
        f"{flag} {shlex.quote(input.get(key))}"
        for key, flag in flags.items()
        if input.get(key)
    )


def report_benchmarks(name):
    # metrics: the one job that scores every method
    steps = [*report_steps(name), *(f"baseline_{m}" for m in BASELINES), "metrics"]
    return [(step, benchmark_table(name, step)) for step in steps]


# Paths in params are taken from the rule's input and output, never written out again: a
# deploying workflow's module ``prefix:`` changes those, not strings in params.


def get_checkpoint(wildcards, output):
    """results/{dataset}/checkpoints/train.pt, beside the model's folder."""
    return str(Path(output.weights).parent.parent / "checkpoints" / "train.pt")


def get_inspect_model(wildcards, input):
    """The folder of model.pt and model.json, which `locusformer inspect --model` takes."""
    return str(Path(input.weights).parent)


def get_report_results(wildcards, input):
    return " ".join(
        f"--result {shlex.quote(f'{m}={path}')}"
        for m, path in zip(methods(), input.results, strict=True)
    )


def get_report_benchmarks(wildcards, input):
    steps = [step for step, _ in report_benchmarks(wildcards.dataset)]
    return " ".join(
        f"--benchmark {shlex.quote(f'{step}={path}')}"
        for step, path in zip(steps, input.benchmarks, strict=True)
    )


def get_summary_metrics(wildcards, input):
    return [
        f"--metrics {shlex.quote(f'{name}={path}')}"
        for name, path in zip(DATASETS.index, input.metrics, strict=True)
    ]


def get_summary_benchmarks(wildcards, input):
    return [
        f"--benchmark {shlex.quote(f'{name}/{method}={path}')}"
        for (name, method, _), path in zip(
            get_benchmarks(), input.benchmarks, strict=True
        )
    ]


def get_index_reports(wildcards, input):
    return [
        f"--report {shlex.quote(f'{name}={path}')}"
        for name, path in zip(DATASETS.index, input.reports, strict=True)
    ]


def get_index_confounding(wildcards, input):
    return [
        f"--confounding {shlex.quote(f'{name}={path}')}"
        for name, path in zip(DATASETS.index, input.confounding, strict=True)
    ]
