"""A dataset row that names a trained model is mapped onto it, not trained: the sheet's
`model` column, checked at `snakemake -n`, and a tiny run of a reference and its query."""

from __future__ import annotations

import json
import os
import re
import time

import anndata as ad
import pandas as pd
import pytest
from conda_envs import env_packages, own_imports, rules
from conftest import ROOT
from scipy import sparse
from workflow_helpers import TEST_DIR, TINY_CONFIG, _demo_row, _env, _snakemake, _workdir


def _refusal(result) -> str:
    """The one error line of a refused run (and that there is exactly one)."""
    assert result.returncode == 1, result.stdout + result.stderr
    said = [line for line in (result.stdout + result.stderr).splitlines() if "error" in line]
    assert len(said) == 1, result.stdout + result.stderr
    assert said[0].startswith("locusformer workflow: error: config/datasets.tsv, dataset ")
    return said[0]


def test_a_model_naming_neither_a_dataset_nor_a_model_folder_fails_in_one_line(tmp_path):
    (tmp_path / "half").mkdir()
    (tmp_path / "half" / "model.pt").write_bytes(b"")  # no model.json beside it
    for model in ("nowhere", "half"):
        rows = [_demo_row("ref"), {**_demo_row("query"), "model": model}]
        line = _refusal(_snakemake(_workdir(tmp_path, {}, rows), "-n"))
        assert f"dataset 'query': model '{model}' is neither a dataset of the sheet" in line
        assert "model.pt and model.json" in line
    assert not (tmp_path / "results").exists()


def test_a_dataset_cannot_be_mapped_onto_itself_or_onto_a_mapped_one(tmp_path):
    line = _refusal(_snakemake(_workdir(tmp_path, {}, [{**_demo_row(), "model": "demo"}]), "-n"))
    assert "dataset 'demo': model 'demo' names the dataset itself" in line
    rows = [
        _demo_row("ref"),
        {**_demo_row("query"), "model": "ref"},
        {**_demo_row("again"), "model": "query"},
    ]
    line = _refusal(_snakemake(_workdir(tmp_path, {}, rows), "-n"))
    assert "dataset 'again': model 'query' is itself mapped onto a model" in line


def test_only_an_h5ad_row_may_leave_samples_empty(tmp_path):
    row = {**_demo_row(), "samples": ""}
    line = _refusal(_snakemake(_workdir(tmp_path, {}, [row]), "-n"))
    assert "dataset 'demo': samples is empty; only an .h5ad expression" in line
    h5ad = {**row, "expression": str(TEST_DIR / "data" / "tiny.h5ad")}
    result = _snakemake(_workdir(tmp_path, {}, [h5ad]), "-n", "-p", "results/demo/samples.tsv")
    assert result.returncode == 0, result.stdout + result.stderr
    [command] = [c for c in result.stdout.splitlines() if "locusformer normalize" in c]
    assert "--samples" not in command


def _commands(stdout: str, step: str) -> list[str]:
    return [line for line in stdout.splitlines() if f"-m locusformer {step} " in line]


def test_a_row_naming_a_dataset_is_planned_as_map_after_that_datasets_training(tmp_path):
    rows = [_demo_row("ref"), {**_demo_row("query"), "model": "ref"}]
    config = {"map": {"adapt_epochs": 2}}
    result = _snakemake(_workdir(tmp_path, config, rows), "-n", "-p")
    assert result.returncode == 0, result.stdout + result.stderr
    [train] = _commands(result.stdout, "train")
    assert "results/ref/ordered.parquet" in train
    assert "--normalize-stats results/ref/stats/normalize.json" in train
    assert not _commands(result.stdout, "correct") or all(
        "results/query" not in c for c in _commands(result.stdout, "correct")
    )
    [mapped] = _commands(result.stdout, "map")
    assert "--weights results/ref/model/model.pt --config results/ref/model/model.json" in mapped
    assert "--samples results/query/samples.tsv" in mapped and "--model-name ref" in mapped
    assert "--adapt-epochs 2" in mapped and "--out-report results/query/mapping.json" in mapped
    [report] = [c for c in _commands(result.stdout, "report") if "--dataset query" in c]
    assert "--mapping results/query/mapping.json" in report
    assert "--history results/ref/model/history.tsv" in report and "--attention" not in report
    assert "logs/benchmarks/query/map.tsv" in report and "query/train.tsv" not in report
    # The trace is the trained model's, in the reference's report only.
    [inspect] = _commands(result.stdout, "inspect")
    assert "--model results/ref/model --matrix results/ref/ordered.parquet" in inspect
    assert "--trace" not in report and "query/inspect.tsv" not in report
    [ref_report] = [c for c in _commands(result.stdout, "report") if "--dataset ref" in c]
    assert "--trace results/ref/inspect.json" in ref_report


def test_a_row_naming_a_model_folder_maps_onto_its_files(tmp_path):
    folder = tmp_path / "trained" / "model"
    folder.mkdir(parents=True)
    for name in ("model.pt", "model.json", "history.tsv"):
        (folder / name).write_text("")
    rows = [{**_demo_row("query"), "model": "trained/model"}]
    result = _snakemake(_workdir(tmp_path, {}, rows), "-n", "-p")
    assert result.returncode == 0, result.stdout + result.stderr
    assert not _commands(result.stdout, "train") and not _commands(result.stdout, "correct")
    [mapped] = _commands(result.stdout, "map")
    assert "--weights trained/model/model.pt --config trained/model/model.json" in mapped
    assert "--model-name trained/model" in mapped
    [report] = _commands(result.stdout, "report")
    assert "--history trained/model/history.tsv" in report
    assert not _commands(result.stdout, "inspect") and "--trace" not in report


# The tiny run: 113 CellBench cells x 600 genes (.test/data), halved. The reference is one
# half as a CSV and its sheet, trained as .test's tiny run trains (a one-layer model,
# three epochs); the query is the other half as an .h5ad whose obs holds the columns (no
# sheet), its Drop-seq cells relabelled as a batch the reference lacks. No baselines but
# the uncorrected data, and only the query's report is asked for (the reference is
# trained, not scored): about 4 min on 2 shared cores, mostly the query's three metrics.
NEW_BATCH = "Drop-seq (run 2)"


def _reference_and_query(tmp_path) -> list[dict]:
    counts = pd.read_csv(TEST_DIR / "data" / "tiny_counts.csv.gz", index_col=0)
    sheet = pd.read_csv(TEST_DIR / "data" / "tiny_samples.csv", index_col=0)
    query_cells = sheet.groupby(["protocol", "cell_line"]).sample(frac=0.5, random_state=1)
    ref_cells = sheet.drop(index=query_cells.index)
    data = tmp_path / "data"
    data.mkdir()
    counts[ref_cells.index].to_csv(data / "ref.csv.gz")
    ref_cells.to_csv(data / "ref_samples.csv")
    obs = query_cells.copy()
    obs["protocol"] = obs["protocol"].replace({"Drop-seq": NEW_BATCH}).astype("category")
    query = ad.AnnData(
        sparse.csr_matrix(counts[obs.index].T.to_numpy(dtype="float32")),
        obs=obs,
        var=pd.DataFrame(index=counts.index),
    )
    query.write_h5ad(data / "query.h5ad")
    tiny = pd.read_csv(TEST_DIR / "config" / "datasets.tsv", sep="\t").iloc[0].to_dict()
    genes = str((TEST_DIR / tiny["genes"]).resolve())
    ref = {**tiny, "name": "ref", "expression": "data/ref.csv.gz"}
    ref.update(samples="data/ref_samples.csv", genes=genes)
    query = {**ref, "name": "query", "expression": "data/query.h5ad", "samples": ""}
    return [ref, {**query, "model": "ref"}]


@pytest.mark.slow
def test_a_query_row_is_mapped_onto_its_reference_scored_and_reported(tmp_path):
    rows = _reference_and_query(tmp_path)
    workdir = _workdir(tmp_path, {**TINY_CONFIG, "baselines": []}, rows)
    imports = tmp_path / "imports"  # tests/import_probe records each job's imports there
    imports.mkdir()
    probe = [str(ROOT / "tests" / "import_probe"), os.environ.get("PYTHONPATH")]
    env = _env(PYTHONPATH=os.pathsep.join(filter(None, probe)), LOCUSFORMER_IMPORTS=str(imports))
    started = time.monotonic()
    targets = ["results/query/report.html", "results/query/corrected.parquet"]
    result = _snakemake(workdir, "--cores", "2", *targets, env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    print(f"reference + mapped query: {time.monotonic() - started:.0f} s")

    out = workdir / "results" / "query"
    assert (out / "corrected.parquet").exists() and (out / "report.html").exists()
    assert not (out / "model").exists() and not (workdir / "logs" / "query" / "train.log").exists()
    assert (workdir / "logs" / "query" / "map.log").exists()
    assert (workdir / "results" / "ref" / "model" / "model.pt").exists()  # trained first
    assert (workdir / "logs" / "benchmarks" / "query" / "map.tsv").exists()
    mapping = json.loads((out / "mapping.json").read_text())
    assert mapping["model"]["name"] == "ref" and mapping["new_batches"] == [NEW_BATCH]
    assert sorted(mapping["trained_batches"]) == ["CEL-seq2", "Drop-seq"]
    # The reference's model recorded how its data were normalized; the query went the same way.
    model = json.loads((workdir / "results" / "ref" / "model" / "model.json").read_text())
    assert model["normalization"]["value_type"] == "counts"
    corrected = pd.read_parquet(out / "corrected.parquet")
    samples = pd.read_csv(out / "samples.tsv", sep="\t", index_col=0)
    assert corrected.index.tolist() == samples.index.tolist()
    metrics = pd.read_csv(out / "metrics.tsv", sep="\t")
    assert {"locusformer", "locusformer_latent", "uncorrected"} == set(metrics["method"])
    html = (out / "report.html").read_text(encoding="utf-8")
    note = re.search(r'<div class="note" id="mapping-note">(.*?)</div>', html, re.S).group(1)
    assert '<code id="mapped-model">ref</code>' in note
    assert NEW_BATCH in note and "zero-shot" in note

    # The map job imported only what its rule's conda env lists.
    jobs = []
    for path in imports.glob("*.json"):
        record = json.loads(path.read_text())
        if record["argv"][1:2] == ["map"]:
            jobs.append(own_imports(record["modules"]))
    assert len(jobs) == 1 and "torch" in jobs[0]
    assert not jobs[0] - set(env_packages(rules()["map"]["env"]))

    # The same query adapted by config alone: the map job runs again (its params changed),
    # the new batch's own shifts are learned for two epochs, and the query's cells of the
    # batch the reference was trained on come out bitwise as zero-shot mapping left them.
    zero_shot = corrected
    _workdir(tmp_path, {**TINY_CONFIG, "baselines": [], "map": {"adapt_epochs": 2}}, rows)
    result = _snakemake(workdir, "--cores", "2", "results/query/corrected.parquet", env=env)
    assert result.returncode == 0, result.stderr[-4000:]
    mapping = json.loads((out / "mapping.json").read_text())
    assert mapping["adapted"] is True and mapping["adapt_epochs"] == 2
    assert len(mapping["adaptation_history"]) == 2
    adapted = pd.read_parquet(out / "corrected.parquet")
    assert adapted.index.tolist() == zero_shot.index.tolist()
    new = (samples["protocol"] == NEW_BATCH).to_numpy()
    assert new.any() and (~new).any()
    pd.testing.assert_frame_equal(adapted[~new], zero_shot[~new], check_exact=True)
    assert not adapted[new].equals(zero_shot[new])
