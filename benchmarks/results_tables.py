"""Write the results tables of ``docs/results.md`` and README.md from benchmark outputs.

Every current table in those documents sits between ``<!-- table:NAME -->`` and
``<!-- /table:NAME -->`` and is written here, never by hand, with the date, commit,
machine and seeds of the run behind it:

    # the quality table: every task, LocusFormer and every baseline, three seeds
    .venv/bin/python benchmarks/quality/variants.py --work W --tasks ... --seeds 0 1 2 \\
        --baselines uncorrected combat harmony --variant '{"name": "default"}'
    .venv/bin/python benchmarks/results_tables.py quality --work W
    # the demo's table, from a finished `make run` (its summary.tsv and rule benchmarks)
    .venv/bin/python benchmarks/results_tables.py demo --results results
    # the simulated suite: every scenario and corrector, three seeds
    .venv/bin/python benchmarks/simulated/suite.py --work W --seeds 0 1 2
    .venv/bin/python benchmarks/results_tables.py simulated --work W
    # its 3,000-sample scenarios on a shallow library, a table of their own
    .venv/bin/python benchmarks/simulated/suite.py --work W2 --seeds 0 1 2 --library shallow \\
        --scenarios n-3000 atlas-10-batches
    .venv/bin/python benchmarks/results_tables.py simulated --work W2 --block simulated-shallow
    # its small studies (tens of samples), a table of their own
    .venv/bin/python benchmarks/simulated/suite.py --work W3 --seeds 0 1 2 \\
        --scenarios n-40 n-150 bulk-6-batches bulk-confounded
    .venv/bin/python benchmarks/results_tables.py simulated --work W3 --block simulated-small
    # bulk studies read as microarray log2 intensities, a table of their own
    .venv/bin/python benchmarks/simulated/suite.py --work W4 --seeds 0 1 2 --library microarray \\
        --scenarios bulk-6-batches bulk-confounded --methods uncorrected combat harmony locusformer
    .venv/bin/python benchmarks/results_tables.py simulated --work W4 --block simulated-microarray
    # the workflow's cost per rule at scale, three runs of each code, interleaved
    .venv/bin/python benchmarks/workflow_scale.py --sizes 10000 100000 1000000 --repeats 3 \\
        --code /tmp/ref --label reference --code . --label current
    .venv/bin/python benchmarks/results_tables.py scale

``quality --check`` (or ``demo --check``, ``simulated --check``, ``scale --check``) writes
nothing and exits 1 when a document's table differs from what the data give (a table edited
by hand, or data rerun without regenerating the documents).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import pandas as pd
from provenance import git, machine

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = {
    "quality": [ROOT / "docs" / "results.md", ROOT / "README.md"],
    "demo": [ROOT / "docs" / "results.md"],
    "simulated": [ROOT / "docs" / "results.md"],
    "simulated-shallow": [ROOT / "docs" / "results.md"],
    "simulated-small": [ROOT / "docs" / "results.md"],
    "simulated-microarray": [ROOT / "docs" / "results.md"],
    "scale": [ROOT / "docs" / "results.md"],
}
TASKS = {
    "protocols": "two protocols (CEL-seq2, Drop-seq; 3 lines)",
    "cellbench5": "five sets, union of genes",
    "cellbench5_inner": "five sets, genes every set measured",
    "cellbench5_skewed": "five sets, skewed composition",
    "pseudobulk_confounded": "confounded pseudo-bulk",
    "pseudobulk_confounded protected": "confounded pseudo-bulk, cell line protected",
    "mixture": "RNA mixtures from single cells",
    "mixture_pooled": "RNA mixtures from pools",
    "rnamix": "RNA mixtures, CEL-seq2 and SORT-seq (CellBench's own)",
    "cellmix": "nine-cell mixtures, four plates (CellBench's own)",
    "control": "no batch effect (random split)",
}
METHODS = {
    "locusformer default": "LocusFormer",
    "sysvi": "SysVI",
    "scvi": "scVI",
    "harmony": "Harmony",
    "combat": "ComBat",
    "combat_mod": "ComBat (line as covariate)",
    "uncorrected": "uncorrected",
}
COLUMNS = ["task", "method", "seed", "batch", "bio", "total", "seconds"]


def quality_rows(work: Path, locusformer: str = "default") -> pd.DataFrame:
    """The rows of ``work``; LocusFormer's are those of the variant named ``locusformer``
    (a default measured under its name before it became the default)."""
    rows = pd.read_csv(work / "results.tsv", sep="\t", header=None, names=COLUMNS)
    rows = rows.drop_duplicates(["task", "method", "seed"], keep="last")
    # The protected run is its own row of the table, beside ComBat told the same labels.
    protected = rows["method"].str.endswith(" protect=cell_line")
    rows.loc[protected, "task"] = rows.loc[protected, "task"] + " protected"
    rows.loc[protected, "method"] = rows.loc[protected, "method"].str.removesuffix(
        " protect=cell_line"
    )
    if locusformer != "default":
        rows = rows[rows["method"] != "locusformer default"].copy()
        rows.loc[rows["method"] == f"locusformer {locusformer}", "method"] = "locusformer default"
    moved = (rows["method"] == "combat_mod") & (rows["task"] == "pseudobulk_confounded")
    rows.loc[moved, "task"] = "pseudobulk_confounded protected"
    return rows[rows["method"].isin(METHODS) & rows["task"].isin(TASKS)]


def quality_table(rows: pd.DataFrame) -> str:
    """Task x method: total, mean ± sd over seeds; the best label-free method in bold."""
    stats = rows.groupby(["task", "method"])["total"].agg(["mean", "std", "count"])
    methods = [m for m in METHODS if m in set(rows["method"])]
    most = int(stats["count"].max())
    lines = [
        "| task | " + " | ".join(METHODS[m] for m in methods) + " |",
        "|" + " --- |" * (len(methods) + 1),
    ]
    for task in [t for t in TASKS if t in set(rows["task"])]:
        here = stats.loc[task]
        # Told the labels, a method is not compared with the label-free ones: the
        # protected row bolds nothing.
        label_free = here.drop(index=["uncorrected", "combat_mod"], errors="ignore")
        best = None if task.endswith(" protected") else label_free["mean"].idxmax()
        cells = []
        for m in methods:
            if m not in here.index:
                cells.append("")
                continue
            mean, sd, n = here.loc[m]
            text = f"{mean:.3f} ± {sd:.3f}" if n > 1 else f"{mean:.3f}"
            if n < most:  # fewer seeds than the rest of the table: said in the cell
                text += f" ({int(n)} seed{'s' if n > 1 else ''})"
            cells.append(f"**{text}**" if m == best else text)
        lines.append(f"| {TASKS[task]} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _shown(run: dict, locusformer: str) -> bool:
    """Whether a recorded run wrote rows the quality table shows: baselines, or the
    LocusFormer variant it reads (other variants' rows stay in the folder, unshown)."""
    if "variant" not in run or run.get("baselines"):
        return True
    names = [json.loads(v).get("name") for v in run["variant"] or []]
    return locusformer in names


def provenance(work: Path, rows: pd.DataFrame, locusformer: str = "default") -> str:
    runs = [json.loads(line) for line in (work / "runs.jsonl").read_text().splitlines()]
    runs = [r for r in runs if _shown(r, locusformer)]
    dates = sorted({r["date"] for r in runs})
    commits = sorted({r["commit"] + (" (uncommitted changes)" if r["dirty"] else "") for r in runs})
    machines = sorted({r["machine"] for r in runs})
    threads = sorted({str(r["threads"]) for r in runs})
    seeds = ", ".join(str(s) for s in sorted(rows["seed"].unique()))
    return (
        f"Measured {dates[0] if len(dates) == 1 else f'{dates[0]} to {dates[-1]}'} at "
        f"{', '.join(commits)} on {'; '.join(machines)} ({', '.join(threads)} thread(s) a "
        f"process), seeds {seeds}; total = 0.4 batch + 0.6 bio (scIB metrics, scib-metrics' "
        "functions; KMeans NMI/ARI the best of ten starts). Mean ± sd over seeds; bold: the "
        "best method that is not told the labels."
        + (
            f" LocusFormer: the runs of the variant `{locusformer}`."
            if locusformer != "default"
            else ""
        )
    )


SIMULATED_COLUMNS = ["scenario", "method", "seed", "batch", "bio", "total", "seconds"]
SIMULATED_METHODS = {
    "locusformer": "LocusFormer",
    "sysvi": "SysVI",
    "scvi": "scVI",
    "harmony": "Harmony",
    "combat": "ComBat",
    "uncorrected": "uncorrected",
}


def simulated_rows(work: Path, locusformer: str | None = None) -> pd.DataFrame:
    """``benchmarks/simulated/suite.py``'s rows, the last of each (scenario, method, seed);
    with ``locusformer`` (the JSON of ``--training``), LocusFormer's are those trained with
    it (a default measured under its overrides before it became the default)."""
    rows = pd.read_csv(work / "results.tsv", sep="\t", header=None, names=SIMULATED_COLUMNS)
    rows = rows.drop_duplicates(["scenario", "method", "seed"], keep="last")
    if locusformer is not None:
        rows = rows[rows["method"] != "locusformer"].copy()
        rows.loc[rows["method"] == f"locusformer {locusformer}", "method"] = "locusformer"
    return rows


def _method_name(method: str) -> str:
    # "locusformer {json}" is LocusFormer trained with overrides: named so, never as the
    # defaults.
    head, _, rest = method.partition(" ")
    return SIMULATED_METHODS.get(head, head) + (f" {rest}" if rest else "")


def simulated_table(rows: pd.DataFrame) -> str:
    """Scenario x method: total, mean ± sd over seeds, the best corrector of each row in
    bold; a last row with each method's mean over the scenarios' means."""
    from locusformer.simulate.scenarios import SUITE

    known = [m for m in SIMULATED_METHODS if m in set(rows["method"])]
    methods = known + sorted(set(rows["method"]) - set(known))
    scenarios = [s for s in SUITE if s in set(rows["scenario"])]
    scenarios += sorted(set(rows["scenario"]) - set(scenarios))
    stats = rows.groupby(["scenario", "method"])["total"].agg(["mean", "std", "count", "size"])
    lines = [
        "| scenario | " + " | ".join(_method_name(m) for m in methods) + " |",
        "|" + " --- |" * (len(methods) + 1),
    ]

    def bold_best(values: pd.Series) -> str | None:
        correctors = values.drop(index="uncorrected", errors="ignore").dropna()
        return correctors.idxmax() if len(correctors) else None

    for scenario in scenarios:
        here = stats.loc[scenario]
        best = bold_best(here["mean"])
        cells = []
        for m in methods:
            if m not in here.index:
                cells.append("")
                continue
            mean, sd, n, tried = here.loc[m]
            if n == 0:
                cells.append("failed")
                continue
            text = f"{mean:.3f} ± {sd:.3f}" if n > 1 else f"{mean:.3f} (1 seed)"
            text = f"**{text}**" if m == best else text
            cells.append(text + (f" ({int(tried - n)} failed)" if tried > n else ""))
        lines.append(f"| {scenario} | " + " | ".join(cells) + " |")
    means = stats["mean"].unstack("method").reindex(index=scenarios, columns=methods)
    overall = means.mean()
    best = bold_best(overall)
    cells = []
    for m in methods:
        n = int(means[m].notna().sum())
        if not n:
            cells.append("")
            continue
        text = f"{overall[m]:.3f}"
        text = f"**{text}**" if m == best else text
        cells.append(text + (f" ({n} of {len(scenarios)} scenarios)" if n < len(scenarios) else ""))
    lines.append("| *mean over scenarios* | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _simulated_shown(run: dict, locusformer: str | None) -> bool:
    """Whether a recorded run wrote rows the table shows: with ``locusformer`` set, not
    LocusFormer's runs at the defaults it replaces."""
    if locusformer is None or run["methods"] != ["locusformer"]:
        return True
    return bool(run.get("training"))


def simulated_provenance(work: Path, rows: pd.DataFrame, locusformer: str | None = None) -> str:
    """When, where and how the suite's rows were measured, and whether the data sets were
    shrunk or LocusFormer trained with anything but its defaults."""
    runs = [json.loads(line) for line in (work / "runs.jsonl").read_text().splitlines()]
    runs = [r for r in runs if _simulated_shown(r, locusformer)]
    dates = sorted({r["date"] for r in runs})
    commits = sorted({r["commit"] + (" (uncommitted changes)" if r["dirty"] else "") for r in runs})
    machines = sorted({r["machine"] for r in runs})
    threads = sorted({str(r["threads"]) for r in runs})
    seeds = ", ".join(str(s) for s in sorted(rows["seed"].unique()))
    text = (
        f"Measured {dates[0] if len(dates) == 1 else f'{dates[0]} to {dates[-1]}'} at "
        f"{', '.join(commits)} on {'; '.join(machines)} ({', '.join(threads)} thread(s) a "
        f"process), seeds {seeds}, {rows['scenario'].nunique()} scenarios; total = 0.4 batch "
        "+ 0.6 bio (the workflow's scIB metrics against the simulated label). Mean ± sd over "
        "seeds; bold: the best corrector of each row (the uncorrected data aside)."
    )
    sizes = sorted(
        {
            (r.get("size_scale", 1.0), r.get("max_samples"), r.get("genes"))
            for r in runs
            if (r.get("size_scale", 1.0), r.get("max_samples"), r.get("genes")) != (1.0, None, None)
        },
        key=str,
    )
    for scale, most, genes in sizes:
        text += (
            f" **Shrunk data sets**: samples x {scale}"
            + (f", at most {most}" if most else "")
            + (f", {genes} genes" if genes else "")
            + " (not the suite's sizes)."
        )
    trainings = sorted({json.dumps(r["training"]) for r in runs if r.get("training")})
    for training in trainings:
        if training == locusformer:
            text += f" LocusFormer: its runs trained with {training}, its defaults."
        else:
            text += f" **LocusFormer trained with {training}**, not its defaults."
    return text


def simulated_text(work: Path, rows: pd.DataFrame, locusformer: str | None = None) -> str:
    return simulated_provenance(work, rows, locusformer) + "\n\n" + simulated_table(rows)


def demo_provenance(results: Path) -> str:
    """When the run behind ``results`` wrote its summary, the release and seed its model
    records, and this machine (where the table is written, as ``make run`` is run)."""
    import datetime

    summary = results / "summary.tsv"
    written = datetime.date.fromtimestamp(summary.stat().st_mtime).isoformat()
    models = sorted(results.glob("*/model/model.json"))
    record = json.loads(models[0].read_text()) if models else {}
    commit = git("rev-parse", "--short", "HEAD")
    return (
        f"`make run` of {written}: locusformer {record.get('locusformer_version', '?')} "
        f"(table written at {commit}), seed {record.get('seed', '?')}, on "
        f"{machine()}. Wall time and "
        "peak memory from the rules' benchmark files (LocusFormer: train + correct)."
    )


def demo_table(results: Path) -> str:
    summary = pd.read_csv(results / "summary.tsv", sep="\t")
    keep = ["method", "batch", "bio", "total", "wall_s", "max_rss_mb"]
    summary = summary[[c for c in keep if c in summary.columns]]
    summary = summary.sort_values("total", ascending=False)
    header = "| " + " | ".join(summary.columns) + " |"
    lines = [header, "|" + " --- |" * len(summary.columns)]
    for row in summary.itertuples(index=False):
        # scores to 3 decimals; seconds and MB to 2 (train + correct is a float sum)
        cells = [
            (f"{v:.3f}" if v <= 1 else f"{v:.2f}") if isinstance(v, float) else str(v) for v in row
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def scale_body(work: Path) -> str:
    """The scale block: ``benchmarks/workflow_scale.py``'s table from its recorded runs,
    after checking that a document has the block (``write`` passes over those without)."""
    from workflow_scale import read_recorded, scale_text

    if not any("<!-- table:scale -->" in doc.read_text() for doc in DOCUMENTS["scale"]):
        names = ", ".join(str(doc.relative_to(ROOT)) for doc in DOCUMENTS["scale"])
        raise SystemExit(f"no <!-- table:scale --> block in {names}")
    return scale_text(*read_recorded(work))


def replace_block(text: str, name: str, body: str) -> str:
    pattern = re.compile(rf"(<!-- table:{name} -->\n).*?(\n<!-- /table:{name} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"no <!-- table:{name} --> block")
    return pattern.sub(lambda m: m.group(1) + body + m.group(2), text)


#: The commit a table was written at moves with every later commit; ``--check`` asks
#: whether the table is its data's, so it reads past it.
WRITTEN_AT = re.compile(r"\(table written at [0-9a-f]+\)")


def write(name: str, body: str, check: bool) -> bool:
    same = True
    for doc in DOCUMENTS[name]:
        text = doc.read_text()
        if f"<!-- table:{name} -->" not in text:
            continue
        new = replace_block(text, name, body)
        if WRITTEN_AT.sub("", new) != WRITTEN_AT.sub("", text):
            same = False
            if not check:
                doc.write_text(new)
                print(f"wrote the {name} table into {doc.relative_to(ROOT)}")
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="table", required=True)
    p = commands.add_parser("quality")
    p.add_argument("--work", type=Path, required=True, help="variants.py's --work folder")
    p.add_argument("--check", action="store_true", help="compare, write nothing")
    p.add_argument(
        "--locusformer", default="default", help="the variant whose rows are LocusFormer's"
    )
    p = commands.add_parser("demo")
    p.add_argument("--results", type=Path, default=ROOT / "results")
    p.add_argument("--check", action="store_true", help="compare, write nothing")
    p = commands.add_parser("simulated")
    p.add_argument("--work", type=Path, required=True, help="simulated/suite.py's --work folder")
    p.add_argument("--check", action="store_true", help="compare, write nothing")
    p.add_argument(
        "--block",
        choices=("simulated", "simulated-shallow", "simulated-small", "simulated-microarray"),
        default="simulated",
        help="the table to write: the suite, its scenarios on a shallow library, its "
        "small studies, or its studies read as microarrays",
    )  # fmt: skip
    p.add_argument(
        "--locusformer", default=None,
        help="the --training JSON whose LocusFormer rows are its defaults' (the rows "
        "without overrides then unshown)",
    )  # fmt: skip
    p = commands.add_parser("scale")
    p.add_argument(
        "--work",
        type=Path,
        default=ROOT / "benchmarks" / "out" / "workflow_scale",
        help="workflow_scale.py's --out folder",
    )
    p.add_argument("--check", action="store_true", help="compare, write nothing")
    args = parser.parse_args()
    name = getattr(args, "block", args.table)
    if args.table == "quality":
        rows = quality_rows(args.work, args.locusformer)
        body = provenance(args.work, rows, args.locusformer) + "\n\n" + quality_table(rows)
    elif args.table == "simulated":
        rows = simulated_rows(args.work, args.locusformer)
        body = simulated_text(args.work, rows, args.locusformer)
    elif args.table == "scale":
        body = scale_body(args.work)
    else:
        body = demo_provenance(args.results) + "\n\n" + demo_table(args.results)
    same = write(name, body, args.check)
    if args.check and not same:
        print(f"the {name} table differs from its data", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
