"""Quality benchmark: LocusFormer against ComBat, Harmony, scVI and SysVI on CellBench tasks.

Runs the workflow itself (same rules, same scoring) once per (variant, seed) in its own
directory under ``--out``, then writes the quality tables (first kept in docs/notes/2026-11-30.md):
mean and standard deviation over seeds per task and method (one table per task, and per
task again for a variant that runs baselines of its own), the ablations, and the bar
checks of issue 5. Needs ``../shared/data`` (the CellBench files). The batch x line
composition of every task is printed and written beside its data
(``data/{task}_composition.tsv``).

    .venv/bin/python benchmarks/quality/run.py                      # everything
    .venv/bin/python benchmarks/quality/run.py --tasks protocols --seeds 0 --variants default
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from tasks import SHARED_TASKS, TASKS, write_task

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "workflow" / "schemas" / "config.schema.yaml"
LABEL = "cell_line"  # every task's label_key (tasks.write_task)

# name -> config overrides. "default" runs the baselines; ablations run LocusFormer only.
VARIANTS: dict[str, dict] = {
    "default": {},
    "shuffled_loci": {"loci": {"order": "shuffled"}},
    "patch_4": {"model": {"patch_size": 4}},
    "patch_16": {"model": {"patch_size": 16}},
    "patch_64": {"model": {"patch_size": 64}},
    "heads_1": {"model": {"n_heads": 1}},
    "heads_8": {"model": {"n_heads": 8}},
    "heads_12": {"model": {"n_heads": 12, "d_model": 96}},
    "heads_64": {"model": {"n_heads": 64}},
    "layers_1": {"model": {"n_layers": 1}},
    "layers_4": {"model": {"n_layers": 4}},
    "adversary_0": {"training": {"adversary_weight": 0.0}},
    "batch_mean_0": {"training": {"batch_mean_weight": 0.0}},
    "batch_mean_1": {"training": {"batch_mean_weight": 1.0}},
    "adversary_0.1": {"training": {"adversary_weight": 0.1}},
    "adversary_1": {"training": {"adversary_weight": 1.0}},
    # One change each from the current defaults toward the previous ones: gradient
    # reversal (at the current weight and schedule); 80 epochs with early stopping.
    "reversal": {"training": {"adversary": "reversal"}},
    "early_stopping": {"training": {"max_epochs": 80, "patience": 10}},
    "residual_on": {"correct": {"add_residual": True}},
}
BASELINES = ["combat", "harmony", "scvi", "sysvi"]


def _schema() -> dict:
    return yaml.safe_load(SCHEMA.read_text()).get("properties", {})


def protect_config(label: str = LABEL) -> dict | None:
    """The config that protects ``label`` in the methods that may use it, when the workflow's
    config schema has a ``protect`` key (a column name or a list of them); None otherwise."""
    spec = _schema().get("protect")
    if spec is None:
        return None
    kinds = spec.get("type")
    kinds = kinds if isinstance(kinds, list) else [kinds]
    if "string" in kinds:
        return {"protect": label}
    if "array" in kinds:
        return {"protect": [label]}
    raise ValueError(f"{SCHEMA}: protect is {kinds}, not a column name or a list of them")


def protected_columns(variant: str) -> list[str]:
    """The sample-sheet columns a variant protects (none for the label-free ones)."""
    columns = VARIANTS.get(variant, {}).get("protect", [])
    return [columns] if isinstance(columns, str) else list(columns)


def label_baselines() -> list[str]:
    """Baselines that use the protected label (ComBat with the label as covariate)."""
    enum = _schema().get("baselines", {}).get("items", {}).get("enum", [])
    return [m for m in ("combat_mod",) if m in enum]


# Label-using runs are a variant of their own, so that their rows (methods that saw the
# labels: combat_mod, and LocusFormer trained with protect) are tabled apart from the
# label-free ones and never ranked with them. protect_config reads the schema's protect
# key (the sample-sheet columns to keep).
VARIANT_BASELINES: dict[str, list[str]] = {"default": BASELINES}
if (_protect := protect_config()) is not None and label_baselines():
    VARIANTS["protected_cell_line"] = _protect
    VARIANT_BASELINES["protected_cell_line"] = label_baselines()


def run_variant(variant: str, seed: int, rows: list[dict], out: Path, cores: int) -> Path:
    workdir = out / "runs" / variant / f"seed{seed}"
    (workdir / "config").mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(workdir / "config" / "datasets.tsv", sep="\t", index=False)
    config = {
        "datasets": "config/datasets.tsv",
        "seed": seed,
        "baselines": VARIANT_BASELINES.get(variant, []),
        **VARIANTS[variant],
    }
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    command = [
        str(Path(sys.executable).parent / "snakemake"),
        "results/summary.tsv",
        "--snakefile", str(ROOT / "workflow" / "Snakefile"),
        "--directory", str(workdir),
        "--cores", str(cores),
        "--quiet", "rules",
    ]  # fmt: skip
    print(f"[quality] {variant} seed {seed}: {' '.join(command)}", flush=True)
    subprocess.run(command, check=True)
    return workdir


def collect(out: Path) -> pd.DataFrame:
    frames = []
    for summary in sorted(out.glob("runs/*/seed*/results/summary.tsv")):
        frame = pd.read_csv(summary, sep="\t")
        frame["variant"] = summary.parents[2].name
        frame["seed"] = int(summary.parents[1].name.removeprefix("seed"))
        metrics = []
        for dataset in frame["dataset"].unique():
            path = summary.parent / dataset / "metrics.tsv"
            if not path.exists():  # per-metric table lost: isolated labels left empty
                continue
            table = pd.read_csv(path, sep="\t")
            table["dataset"] = dataset
            metrics.append(table)
        empty = pd.DataFrame(columns=["dataset", "method", "metric", "value"])
        iso = pd.concat(metrics) if metrics else empty
        iso = iso[iso["metric"] == "Isolated labels"].set_index(["dataset", "method"])["value"]
        frame["isolated_labels"] = [
            iso.get((d, m)) for d, m in zip(frame["dataset"], frame["method"], strict=True)
        ]
        frames.append(frame)
    return pd.concat(frames, ignore_index=True)


def _fmt(values: pd.Series) -> str:
    if len(values) == 0:
        return "not run"
    if values.notna().sum() == 0:
        return "failed"
    if values.notna().sum() == 1:
        return f"{values.mean():.3f}"
    return f"{values.mean():.3f} ± {values.std(ddof=1):.3f}"


def _peak(values: pd.Series) -> str:
    """Largest peak memory of the runs; in-process runs (inprocess.py) measure none."""
    return "not measured" if values.isna().all() else f"{values.max():.0f}"


def tables(results: pd.DataFrame) -> str:
    lines = []
    for variant in VARIANT_BASELINES:
        runs = results[results["variant"] == variant]
        if variant != "default":  # only the methods this variant is run for, and the reference
            keep = ["uncorrected", *VARIANT_BASELINES[variant]]
            # a method's row may carry what it protects: "combat_mod (mod: cell_line)"
            base = runs["method"].astype(str).str.split(" (", n=1, regex=False).str[0]
            runs = runs[base.isin(keep)]
        lines += _task_tables(runs, "" if variant == "default" else f", {variant}")
    # The label-using variants' LocusFormer is the default's (it never sees the labels).
    apart = [v for v in VARIANT_BASELINES if v != "default"]
    ablation = results[(results["method"] == "locusformer") & ~results["variant"].isin(apart)]
    if ablation["variant"].nunique() > 1:
        tasks = list(ablation["dataset"].unique())
        lines += ["### Ablations (LocusFormer total; mean ± sd over seeds)", ""]
        lines += ["| variant | " + " | ".join(tasks) + " |", "| --- |" + " --- |" * len(tasks)]
        for variant in VARIANTS:
            v = ablation[ablation["variant"] == variant]
            if len(v):
                cells = [_fmt(v[v["dataset"] == t]["total"]) for t in tasks]
                lines.append(f"| {variant} | " + " | ".join(cells) + " |")
        lines.append("")
        # Where a total moves, which half moved it.
        lines += ["### Ablations: batch / bio (LocusFormer; means over seeds)", ""]
        lines += ["| variant | seeds | " + " | ".join(tasks) + " |"]
        lines += ["| --- | --- |" + " --- |" * len(tasks)]
        for variant in VARIANTS:
            v = ablation[ablation["variant"] == variant]
            if len(v):
                seeds = "/".join(str(v[v["dataset"] == t]["seed"].nunique()) for t in tasks)
                cells = []
                for t in tasks:
                    d = v[v["dataset"] == t]
                    cells.append(
                        f"{d['batch'].mean():.3f} / {d['bio'].mean():.3f}" if len(d) else ""
                    )
                lines.append(f"| {variant} | {seeds} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def _task_tables(runs: pd.DataFrame, suffix: str) -> list[str]:
    """One table per task (dataset): mean ± sd over seeds of each method."""
    lines = []
    for task, rows in runs.groupby("dataset", sort=False):
        seeds = rows["seed"].nunique()
        lines += [f"### {task}{suffix} ({seeds} seed{'s' if seeds > 1 else ''}; mean ± sd)", ""]
        lines += ["| method | batch | bio | total | wall time (s) | peak memory (MB) |"]
        lines += ["| --- | --- | --- | --- | --- | --- |"]
        order = rows.groupby("method")["total"].mean().sort_values(ascending=False).index
        for method in order:
            m = rows[rows["method"] == method]
            lines.append(
                f"| {method} | {_fmt(m['batch'])} | {_fmt(m['bio'])} | {_fmt(m['total'])} | "
                f"{m['wall_s'].median():.1f} | {_peak(m['max_rss_mb'])} |"
            )
        lines.append("")
    return lines


def _verdict(ok: bool) -> str:
    return "yes" if ok else "NO"


def bar_checks(results: pd.DataFrame) -> str:
    default = results[results["variant"] == "default"]
    columns = ["total", "bio", "isolated_labels", "wall_s"]
    mean = default.groupby(["dataset", "method"])[columns].mean()
    lines = ["### Bar checks", ""]

    def value(task: str, method: str, column: str) -> float | None:
        return mean.loc[(task, method), column] if (task, method) in mean.index else None

    for task in ("protocols", "cellbench5"):
        ours = value(task, "locusformer", "total")
        for base in BASELINES:
            theirs = value(task, base, "total")
            if ours is not None and theirs is not None:
                lines.append(
                    f"- {task}: LocusFormer total {ours:.3f} > {base} {theirs:.3f}: "
                    + _verdict(ours > theirs)
                )
    ours, theirs = value("control", "locusformer", "bio"), value("control", "uncorrected", "bio")
    if ours is not None and theirs is not None:
        gap = ours - theirs
        lines.append(
            f"- control: bio change against uncorrected {gap:+.3f} (bar: within 0.02): "
            + _verdict(abs(gap) <= 0.02)
        )
    # What the correction itself does to biology there: against the same model trained
    # without the adversary (the autoencoder's own denoising is common to both).
    plain = results[
        (results["variant"] == "adversary_0")
        & (results["dataset"] == "control")
        & (results["method"] == "locusformer")
    ]
    if ours is not None and len(plain):
        gap = ours - plain["bio"].mean()
        lines.append(
            f"- control: bio change against the same model without adversary {gap:+.3f} "
            f"({plain['seed'].nunique()} seeds; not the bar, what the correction does)"
        )
    ours = value("cellbench5", "locusformer", "isolated_labels")
    theirs = value("cellbench5", "uncorrected", "isolated_labels")
    if ours is not None and theirs is not None:
        lines.append(
            f"- cellbench5: isolated labels {ours:.3f} against uncorrected {theirs:.3f}: "
            + _verdict(ours >= theirs)
        )
    ours, theirs = (
        value("pseudobulk", "locusformer", "total"),
        value("pseudobulk", "combat", "total"),
    )
    if ours is not None and theirs is not None:
        lines.append(
            f"- pseudobulk: total {ours:.3f} against ComBat {theirs:.3f}: "
            + _verdict(ours >= theirs)
        )
    ours, theirs = (
        value("cellbench5", "locusformer", "wall_s"),
        value("cellbench5", "scvi", "wall_s"),
    )
    if ours is not None and theirs is not None:
        lines.append(
            f"- cellbench5: LocusFormer train+correct {ours:.0f} s against scVI {theirs:.0f} s "
            f"(ratio {ours / theirs:.2f}): " + _verdict(ours <= theirs)
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared" / "data")
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "out" / "quality")
    parser.add_argument("--tasks", nargs="+", default=list(SHARED_TASKS), choices=TASKS)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--cores", type=int, default=2)
    parser.add_argument("--collect-only", action="store_true")
    args = parser.parse_args()
    if not args.collect_only:
        if not (args.shared / "cellbench").is_dir():
            sys.exit(f"{args.shared}/cellbench not found: the benchmark needs the CellBench files")
        rows = [write_task(task, args.shared, args.out / "data") for task in args.tasks]
        for task in args.tasks:
            table = pd.read_csv(args.out / "data" / f"{task}_composition.tsv", sep="\t")
            print(f"[quality] {task}: samples per batch and cell line\n{table.to_string()}")
        for variant in args.variants:
            for seed in args.seeds:
                run_variant(variant, seed, rows, args.out, args.cores)
    results = collect(args.out)
    results.to_csv(args.out / "results.tsv", sep="\t", index=False)
    report = tables(results) + "\n" + bar_checks(results)
    (args.out / "results.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
