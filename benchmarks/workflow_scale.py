"""The whole workflow at scale (issue 15, goal 2; issue 42, goal 3): every rule's time and
memory per size, for one or more versions of the code, each the median of repeated runs.

For each of ``--sizes`` it simulates counts of n samples x 2,500 genes in 8 batches with 6
cell groups (``locusformer simulate``, a sparse .h5ad, so the bio metrics mean something),
once per size, shared by every run. Each run writes a one-dataset config (baselines ComBat
and Harmony; every other setting the workflow's default, ``metrics.max_samples`` included)
and runs one checkout's workflow to its report with ``snakemake --cores 2``. scVI is not in
the run: it is an optional extra, and on 2 CPU cores its default training (400 epochs at 1M
samples) would not finish in hours.

``--code DIR --label NAME`` (repeatable, in pairs) names a checkout whose code runs: its
``workflow/Snakefile``, with ``PYTHONPATH=DIR/src`` so the rules' ``python -m locusformer``
is that checkout's. Without ``--code`` the code is this repository's, labelled ``current``.
``--repeats R`` runs every (size, code) R times, interleaved (reference r0, current r0,
reference r1, ...) so drifts in the machine's load hit every code alike. The claim is the
ratio of medians, reference / current, measured on one machine in one command; absolute
times depend on the machine and its load.

    # the reference code in a worktree of its commit, then both codes, interleaved
    git worktree add /tmp/ref <commit>
    .venv/bin/python benchmarks/workflow_scale.py --sizes 10000 100000 1000000 --repeats 3 \\
        --code /tmp/ref --label reference --code . --label current
    # the table again, from the recorded runs
    .venv/bin/python benchmarks/workflow_scale.py --table
    # into docs/results.md (between <!-- table:scale --> and <!-- /table:scale -->)
    .venv/bin/python benchmarks/results_tables.py scale

``--prune`` deletes each recorded run's matrices, models and checkpoints (a 1M run
writes about 56 GB), keeping what the tables read. Every run works in
``OUT/<label>/n<size>/r<k>/`` (git-ignored, under ``benchmarks/out``),
the data in ``OUT/data/n<size>/``. A run records itself in its ``run.json`` (label, size,
repeat, commit and whether that checkout had uncommitted changes, date, machine, the whole
run's wall seconds) once its workflow has finished; a run with a ``run.json`` is not run
again, and a folder without one (an interrupted run) is emptied and run afresh. Each
rule's ``benchmark:`` file (wall seconds, peak RSS) is collected into ``OUT/rules.tsv``,
one row per (label, size, repeat, rule); each run's ``results/summary.tsv`` into
``OUT/runs.tsv``, one row per (run, summary row), its columns as the file has them beside
the run's record.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from provenance import git, machine

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
N_GENES, N_BATCHES, N_GROUPS = 2500, 8, 6
REFERENCE, CURRENT = "reference", "current"
WHOLE_RUN = "whole run (wall)"
RUN_COLUMNS = [
    "label", "size", "repeat", "commit", "dirty", "date", "machine", "cores", "workflow_s"
]  # fmt: skip


def simulate(n: int, data: Path) -> None:
    """Simulate ``n`` samples into ``data`` (expr.h5ad, samples.tsv, row.tsv), unless there.

    Parameters
    ----------
    n : int
        Number of samples.
    data : Path
        Folder of the simulated data set, shared by every run of this size.
    """
    if (data / "row.tsv").exists():
        return
    data.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(BIN / "locusformer"), "simulate", "--out-expression", str(data / "expr.h5ad"),
         "--out-samples", str(data / "samples.tsv"), "--out-row", str(data / "row.tsv"),
         "--name", "sim", "--n-samples", str(n), "--n-genes", str(N_GENES),
         "--n-batches", str(N_BATCHES), "--n-groups", str(N_GROUPS), "--seed", "0"],
        check=True,
    )  # fmt: skip


def configure(work: Path, data: Path) -> None:
    """Write ``work``/config: one data set (the one in ``data``), ComBat and Harmony.

    Parameters
    ----------
    work : Path
        The run's working directory.
    data : Path
        Folder written by :func:`simulate`.
    """
    (work / "config").mkdir(parents=True, exist_ok=True)
    row = pd.read_csv(data / "row.tsv", sep="\t")
    for column in ("expression", "samples"):  # simulate names them relative to its cwd
        row[column] = [str((data / Path(p).name).resolve()) for p in row[column]]
    row.to_csv(work / "config" / "datasets.tsv", sep="\t", index=False)
    config = {"datasets": "config/datasets.tsv", "seed": 0, "baselines": ["combat", "harmony"]}
    (work / "config" / "config.yaml").write_text(yaml.safe_dump(config))


def codes_from(codes: Sequence[Path] | None, labels: Sequence[str] | None) -> dict[str, Path]:
    """Pair ``--code`` and ``--label`` in order: label -> checkout.

    Parameters
    ----------
    codes : sequence of Path or None
        Checkouts; none means this repository.
    labels : sequence of str or None
        One label a checkout; none with at most one checkout means ``current``.

    Returns
    -------
    dict of str to Path
        Label -> resolved checkout, in the order given (the order of the runs).
    """
    codes = list(codes or [ROOT])
    labels = list(labels or ([CURRENT] if len(codes) == 1 else []))
    if len(labels) != len(codes):
        raise SystemExit(f"{len(codes)} --code but {len(labels)} --label: give one label a code")
    if len(set(labels)) != len(labels) or any("/" in name or not name for name in labels):
        raise SystemExit(f"labels must be distinct folder names, not {labels}")
    for code in codes:
        if not (code / "workflow" / "Snakefile").is_file():
            raise SystemExit(f"{code} has no workflow/Snakefile")
    return {name: code.resolve() for name, code in zip(labels, codes, strict=True)}


def plan(sizes: Sequence[int], labels: Sequence[str], repeats: int) -> list[tuple[int, int, str]]:
    """The runs, in the order they run: per size, repeat after repeat, every label in turn.

    Parameters
    ----------
    sizes : sequence of int
        Sample counts, smallest first as given.
    labels : sequence of str
        The codes' labels.
    repeats : int
        Runs of each (size, label).

    Returns
    -------
    list of (int, int, str)
        (size, repeat, label): reference r0, current r0, reference r1, current r1, ...
    """
    return [(n, k, label) for n in sizes for k in range(repeats) for label in labels]


def work_dir(out: Path, label: str, n: int, repeat: int) -> Path:
    """The working directory of one run.

    Parameters
    ----------
    out : Path
        The benchmark's output folder.
    label : str
        The code's label.
    n, repeat : int
        Size and repeat index.

    Returns
    -------
    Path
        ``out/<label>/n<n>/r<repeat>``.
    """
    return out / label / f"n{n}" / f"r{repeat}"


def run_workflow(work: Path, code: Path, cores: int) -> float:
    """Run ``code``'s workflow in ``work`` to its end; its wall seconds.

    Parameters
    ----------
    work : Path
        The run's working directory, configured.
    code : Path
        The checkout whose Snakefile and ``src/`` run.
    cores : int
        Snakemake's ``--cores``.

    Returns
    -------
    float
        Wall seconds of the whole ``snakemake`` call.
    """
    env = {**os.environ, "PYTHONPATH": str(code / "src")}
    start = time.perf_counter()
    with open(work / "snakemake.log", "w") as log:
        done = subprocess.run(
            [str(BIN / "snakemake"), "--snakefile", str(code / "workflow" / "Snakefile"),
             "--directory", str(work), "--cores", str(cores)],
            check=False, stdout=log, stderr=subprocess.STDOUT, env=env,
        )  # fmt: skip
    if done.returncode:
        raise SystemExit(f"the workflow failed in {work}: see {work / 'snakemake.log'}")
    return time.perf_counter() - start


def run_once(out: Path, n: int, repeat: int, label: str, code: Path, cores: int) -> None:
    """One run of ``code`` on size ``n``, recorded in its ``run.json``; skipped when
    recorded already.

    Parameters
    ----------
    out : Path
        The benchmark's output folder.
    n, repeat : int
        Size and repeat index.
    label : str
        The code's label.
    code : Path
        The checkout that runs.
    cores : int
        Snakemake's ``--cores``.
    """
    work = work_dir(out, label, n, repeat)
    if (work / "run.json").exists():
        return
    if work.exists():  # an interrupted run: its partial timings would mix with new ones
        shutil.rmtree(work)
    data = out / "data" / f"n{n}"
    simulate(n, data)
    configure(work, data)
    commit = git("-C", str(code), "rev-parse", "HEAD")
    dirty = bool(git("-C", str(code), "status", "--porcelain", "--untracked-files=no"))
    wall = run_workflow(work, code, cores)
    record = {
        "label": label,
        "size": n,
        "repeat": repeat,
        "commit": commit,
        "dirty": dirty,
        "date": time.strftime("%Y-%m-%d"),
        "machine": machine(),
        "cores": cores,
        "workflow_s": round(wall, 2),
        "code": str(code),
    }
    (work / "run.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"{label} r{repeat}, {n} samples: workflow {wall:.0f} s", flush=True)


#: What a finished run's tables are read from (rules' benchmark files, the summary, the
#: report's size) is kept by :func:`prune`; the matrices go (about 56 GB at 1M samples).
PRUNED_SUFFIXES = (".h5ad", ".parquet", ".pt", ".npz")


def prune(work: Path) -> float:
    """Delete a recorded run's matrices, models and checkpoints; the GB freed.

    Parameters
    ----------
    work : Path
        A run's folder with its ``run.json``.

    Returns
    -------
    float
        The size of the files deleted, in GB.
    """
    if not (work / "run.json").exists():
        raise ValueError(f"{work} has no run.json: only a finished run is pruned")
    freed = 0
    for path in (work / "results").rglob("*"):
        if path.is_file() and path.suffix in PRUNED_SUFFIXES:
            freed += path.stat().st_size
            path.unlink()
    return freed / 1e9


def recorded(out: Path) -> list[tuple[Path, dict]]:
    """Every finished run under ``out``.

    Parameters
    ----------
    out : Path
        The benchmark's output folder.

    Returns
    -------
    list of (Path, dict)
        Each run's folder and its ``run.json``, in path order.
    """
    found = sorted(out.glob("*/n*/r*/run.json"))
    return [(path.parent, json.loads(path.read_text())) for path in found]


def collect(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read every finished run's rule benchmarks and summary.

    Parameters
    ----------
    out : Path
        The benchmark's output folder.

    Returns
    -------
    rules : DataFrame
        One row per (label, size, repeat, rule): ``seconds``, ``max_rss_mb``.
    runs : DataFrame
        One row per (run, summary row): the run's record (``RUN_COLUMNS``, ``report_mb``)
        and the summary's columns.
    """
    rules, runs = [], []
    for work, record in recorded(out):
        key = {k: record[k] for k in ("label", "size", "repeat", "commit")}
        for tsv in sorted((work / "logs" / "benchmarks").rglob("*.tsv")):
            b = pd.read_csv(tsv, sep="\t")
            rules.append(
                {
                    **key,
                    "rule": tsv.stem,
                    "seconds": float(b["s"].iloc[0]),
                    "max_rss_mb": float(b["max_rss"].iloc[0]),
                }
            )
        report = next(work.glob("results/*/report.html"), None)
        run = {k: record.get(k) for k in RUN_COLUMNS}
        run["report_mb"] = report.stat().st_size / 1e6 if report is not None else float("nan")
        summary = work / "results" / "summary.tsv"
        scores = pd.read_csv(summary, sep="\t") if summary.exists() else pd.DataFrame([{}])
        runs.append(scores.assign(**run)[[*run, *scores.columns]])
    rules_frame = pd.DataFrame(rules, columns=["label", "size", "repeat", "commit", "rule"])
    if rules:
        rules_frame = pd.DataFrame(rules)
    runs_frame = pd.concat(runs, ignore_index=True) if runs else pd.DataFrame(columns=RUN_COLUMNS)
    return rules_frame, runs_frame


def read_recorded(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``OUT/rules.tsv`` and ``OUT/runs.tsv`` as :func:`collect` made them (commits as text).

    Parameters
    ----------
    out : Path
        The benchmark's output folder.

    Returns
    -------
    rules, runs : DataFrame
        The frames :func:`scale_text` reads.
    """
    for name in ("rules.tsv", "runs.tsv"):
        if not (out / name).exists():
            raise SystemExit(f"no {out / name}: run benchmarks/workflow_scale.py first")
    read = {"sep": "\t", "dtype": {"commit": str, "label": str}}
    return pd.read_csv(out / "rules.tsv", **read), pd.read_csv(out / "runs.tsv", **read)


def _seconds(value: float) -> str:
    """Seconds as a cell: a decimal below 10, whole seconds above, blank when missing."""
    if pd.isna(value):
        return ""
    return f"{value:.1f}" if value < 10 else f"{value:,.0f}"


def _ratio(reference: float, current: float) -> str:
    """The speed-up cell, reference / current; blank when either is missing."""
    if pd.isna(reference) or pd.isna(current) or current <= 0:
        return ""
    return f"{reference / current:.2f}×"


def cost(rules: pd.DataFrame, runs: pd.DataFrame, n: int) -> pd.DataFrame:
    """Per label and rule at size ``n``: median seconds, max GB, number of runs; the whole
    run's wall seconds as the rule ``WHOLE_RUN``.

    Parameters
    ----------
    rules, runs : DataFrame
        :func:`collect`'s frames.
    n : int
        The size.

    Returns
    -------
    DataFrame
        Indexed by (label, rule), columns ``seconds`` (median), ``gb`` (max of the runs'
        peaks; NaN for the whole run) and ``runs``.
    """
    here = rules[rules["size"] == n]
    per_rule = here.groupby(["label", "rule"]).agg(
        seconds=("seconds", "median"), gb=("max_rss_mb", "max"), runs=("seconds", "size")
    )
    per_rule["gb"] = per_rule["gb"] / 1024
    whole = runs[runs["size"] == n].drop_duplicates(["label", "repeat"])
    whole = whole.groupby("label").agg(
        seconds=("workflow_s", "median"), runs=("workflow_s", "size")
    )
    whole = whole.assign(rule=WHOLE_RUN, gb=float("nan")).set_index("rule", append=True)
    return pd.concat([per_rule, whole[per_rule.columns]]).sort_index()


def cost_table(
    rules: pd.DataFrame,
    runs: pd.DataFrame,
    n: int,
    reference: str = REFERENCE,
    current: str = CURRENT,
) -> str:
    """Markdown: one row per rule (costliest first for ``current``), the whole run last.

    Parameters
    ----------
    rules, runs : DataFrame
        :func:`collect`'s frames.
    n : int
        The size.
    reference, current : str
        The labels compared; without ``reference`` runs the table has ``current`` alone.

    Returns
    -------
    str
        The table: current median s and max GB, the reference's, and the speed-up
        reference / current of the medians.
    """
    stats = cost(rules, runs, n)
    labels = set(stats.index.get_level_values("label"))
    both = reference in labels
    names = stats.loc[current].drop(index=WHOLE_RUN, errors="ignore")
    order = [*names.sort_values("seconds", ascending=False).index]
    if both:  # rules only the reference has, after
        order += sorted(set(stats.loc[reference].index) - set(order) - {WHOLE_RUN})
    order.append(WHOLE_RUN)
    head = f"| rule | {current}: median s | {current}: max GB |"
    if both:
        head += (
            f" {reference}: median s | {reference}: max GB | speed-up ({reference} / {current}) |"
        )
    lines = [head, "|" + " --- |" * (head.count(" | ") + 1)]

    def cells(label: str, rule: str) -> tuple[float, list[str]]:
        if (label, rule) not in stats.index:
            return float("nan"), ["", ""]
        row = stats.loc[(label, rule)]
        gb = "" if pd.isna(row["gb"]) else f"{row['gb']:.2f}"
        return row["seconds"], [_seconds(row["seconds"]), gb]

    for rule in order:
        cur_s, row = cells(current, rule)
        if both:
            ref_s, ref_cells = cells(reference, rule)
            row += [*ref_cells, _ratio(ref_s, cur_s)]
        name = f"**{rule}**" if rule == WHOLE_RUN else rule
        lines.append(f"| {name} | " + " | ".join(row) + " |")
    return "\n".join(lines)


def score_table(
    runs: pd.DataFrame, n: int, reference: str = REFERENCE, current: str = CURRENT
) -> str:
    """Markdown: each method's median total per label at size ``n``, and the difference.

    Parameters
    ----------
    runs : DataFrame
        :func:`collect`'s runs frame.
    n : int
        The size.
    reference, current : str
        The labels compared.

    Returns
    -------
    str
        One row per method, best current total first.
    """
    here = runs[(runs["size"] == n) & runs["method"].notna()]
    totals = here.groupby(["method", "label"])["total"].median().unstack("label")
    both = reference in totals.columns
    totals = totals.sort_values(current, ascending=False)
    head = f"| method | {current}: total |" + (
        f" {reference}: total | {current} − {reference} |" if both else ""
    )
    lines = [head, "|" + " --- |" * (head.count(" | ") + 1)]
    for method, row in totals.iterrows():
        cells = [f"{row[current]:.4f}"]
        if both:
            cells += [f"{row[reference]:.4f}", f"{row[current] - row[reference]:+.4f}"]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def provenance_line(runs: pd.DataFrame, labels: Sequence[str]) -> str:
    """When, where and at which commits the runs were measured, and how many a cell holds.

    Parameters
    ----------
    runs : DataFrame
        :func:`collect`'s runs frame.
    labels : sequence of str
        The labels shown, the reference first when there are two.

    Returns
    -------
    str
        One paragraph.
    """
    record = runs.drop_duplicates(["label", "size", "repeat"])
    dates = sorted(record["date"].unique())
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    cores = "/".join(str(c) for c in sorted(record["cores"].dropna().astype(int).unique()))
    codes = []
    for label in labels:
        mine = record[record["label"] == label]
        pairs = zip(mine["commit"], mine["dirty"], strict=True)
        commits = sorted({c[:9] + (" (uncommitted changes)" if d else "") for c, d in pairs})
        counts = sorted(set(mine.groupby("size").size()))
        runs_a_size = f"{'/'.join(map(str, counts))} run{'s' if counts != [1] else ''} a size"
        codes.append(f"{label} = {', '.join(commits)} ({runs_a_size})")
    return (
        f"Measured {when} on {'; '.join(sorted(record['machine'].unique()))}"
        + (", the codes' runs interleaved: " if len(labels) > 1 else ": ")
        + f"{'; '.join(codes)}. `snakemake --cores {cores}`, {N_GENES:,} genes, "
        f"{N_BATCHES} batches, {N_GROUPS} groups, baselines ComBat and Harmony. Seconds: the "
        "median of the runs; GB: the largest peak RSS of the runs"
        + (
            f"; speed-up: {labels[0]}'s median over {labels[1]}'s (above 1: {labels[1]} is faster)."
            if len(labels) == 2
            else "."
        )
    )


def scale_text(
    rules: pd.DataFrame,
    runs: pd.DataFrame,
    reference: str = REFERENCE,
    current: str = CURRENT,
) -> str:
    """The whole markdown: provenance, then per size the cost table and the scores.

    Parameters
    ----------
    rules, runs : DataFrame
        :func:`collect`'s frames (or ``OUT/rules.tsv`` and ``OUT/runs.tsv`` read back).
    reference, current : str
        The labels compared.

    Returns
    -------
    str
        Markdown, the body of the ``scale`` block of docs/results.md.
    """
    if current not in set(runs["label"]):
        raise SystemExit(f"no run labelled {current!r}")
    labels = [label for label in (reference, current) if label in set(runs["label"])]
    parts = [provenance_line(runs, labels)]
    for n in sorted(runs.loc[runs["label"] == current, "size"].unique()):
        parts.append(f"**{n:,} samples**: cost per rule")
        parts.append(cost_table(rules, runs, n, reference, current))
        parts.append(f"**{n:,} samples**: scores (median total of the runs)")
        parts.append(score_table(runs, n, reference, current))
    return "\n\n".join(parts)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the planned runs not yet recorded, then write ``rules.tsv``, ``runs.tsv`` and
    print the tables.

    Parameters
    ----------
    argv : sequence of str, optional
        The arguments; ``sys.argv[1:]`` when None.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "workflow_scale")
    parser.add_argument("--code", type=Path, action="append", help="a checkout (repeatable)")
    parser.add_argument("--label", action="append", help="the name of the --code before it")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each size and code")
    parser.add_argument("--cores", type=int, default=2, help="snakemake --cores")
    parser.add_argument("--table", action="store_true", help="print the table and stop")
    parser.add_argument(
        "--prune", action="store_true",
        help="once a run is recorded, delete its matrices, models and checkpoints",
    )  # fmt: skip
    parser.add_argument(
        "--compare", nargs=2, default=[REFERENCE, CURRENT], metavar=("REFERENCE", "CURRENT"),
        help="the labels the table compares (default: reference current)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if not args.table:
        codes = codes_from(args.code, args.label)
        if args.prune:  # the runs recorded before, ahead of the disk the new ones need
            for work, _ in recorded(args.out):
                prune(work)
        for n, repeat, label in plan(args.sizes, list(codes), args.repeats):
            run_once(args.out, n, repeat, label, codes[label], args.cores)
            if args.prune:
                prune(work_dir(args.out, label, n, repeat))
    rules, runs = collect(args.out)
    if runs.empty:
        raise SystemExit(f"no finished run under {args.out}")
    rules.to_csv(args.out / "rules.tsv", sep="\t", index=False)
    runs.to_csv(args.out / "runs.tsv", sep="\t", index=False)
    print(scale_text(rules, runs, *args.compare))


if __name__ == "__main__":
    main()
