"""Scoring on a stratified subsample (issue 15): the draw, the scoring, the CLI, the report."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import ROOT, synthetic_groups

from locusformer.baselines.methods import run_method
from locusformer.cli.main import main
from locusformer.cli.parser import build_parser
from locusformer.errors import InputError
from locusformer.io.results import write_result
from locusformer.report.render import render_dataset_report
from locusformer.report.sections import metrics_section, subsample_sentence
from locusformer.scoring import metrics, tables
from locusformer.scoring.representations import read_representations, stored_representation
from locusformer.scoring.subsample import (
    DEFAULT_MAX_SAMPLES,
    SUBSAMPLE_METRICS,
    allocate,
    check_max_samples,
    scoring_subsample,
    with_subsample_rows,
)
from locusformer.steps import metrics as steps_metrics


def uneven_obs() -> pd.DataFrame:
    """1000 samples in 3 batches x 3 labels of very different sizes, one of 5 samples."""
    sizes = {("b0", "t0"): 400, ("b0", "t1"): 200, ("b1", "t0"): 150, ("b1", "t2"): 120}
    sizes |= {("b2", "t1"): 80, ("b2", "t2"): 45, ("b2", "t0"): 5}
    rows = [(b, t) for (b, t), size in sizes.items() for _ in range(size)]
    rng = np.random.default_rng(3)
    rows = [rows[i] for i in rng.permutation(len(rows))]  # strata interleaved
    obs = pd.DataFrame(rows, columns=["batch", "cell_type"])
    obs.index = [f"s{i}" for i in range(len(obs))]
    return obs


# --------------------------------------------------------------------------- the draw


@pytest.mark.parametrize("n", [2, 7, 100, 333, 999])
def test_each_stratum_keeps_its_share_within_rounding(n) -> None:
    obs = uneven_obs()
    picked = scoring_subsample(obs, "batch", "cell_type", n, seed=0)
    assert len(picked) == n and picked.is_unique
    assert list(picked) == [s for s in obs.index if s in set(picked)]  # obs's order
    sizes = obs.groupby(["batch", "cell_type"]).size()
    kept = obs.loc[picked].groupby(["batch", "cell_type"]).size().reindex(sizes.index, fill_value=0)
    share = n * sizes / len(obs)
    if n >= len(sizes):
        # every stratum present: the 5-sample one's share (0.5 at n = 100) rounds to one
        assert (kept >= 1).all(), kept
    if n >= 100:
        # the samples the small strata are given come from the large ones within rounding
        assert (np.abs(kept - share) < 1).all(), pd.DataFrame({"kept": kept, "share": share})
    if n < len(sizes):
        # fewer samples than strata: the largest shares, one each
        assert kept.max() == 1 and kept.sum() == n
        assert set(kept[kept == 1].index) == set(share.nlargest(n).index)


def test_allocation_rounds_by_largest_remainder_and_keeps_one_per_stratum() -> None:
    # shares 50, 30, 15, 4.5, 0.5: the 4.5 rounds up first, then gives its extra sample to
    # the 0.5 so that no stratum is left out
    np.testing.assert_array_equal(allocate([500, 300, 150, 45, 5], 100), [50, 30, 15, 4, 1])
    np.testing.assert_array_equal(allocate([3, 3, 3], 5), [2, 2, 1])
    np.testing.assert_array_equal(allocate([1] * 6, 4), [1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(allocate([4, 2], 10), [4, 2])  # all kept


def test_the_draw_is_seeded_and_by_batch_without_labels() -> None:
    obs = uneven_obs()
    first = scoring_subsample(obs, "batch", "cell_type", 100, seed=4)
    assert first.equals(scoring_subsample(obs, "batch", "cell_type", 100, seed=4))
    other = scoring_subsample(obs, "batch", "cell_type", 100, seed=5)
    assert not first.equals(other) and len(other) == 100
    by_batch = scoring_subsample(obs, "batch", None, 100, seed=4)
    kept = obs.loc[by_batch, "batch"].value_counts().sort_index()
    assert kept.to_dict() == {"b0": 60, "b1": 27, "b2": 13}  # shares 60, 27, 13 exactly
    assert scoring_subsample(obs, "batch", "cell_type", len(obs), seed=4) is None
    with pytest.raises(InputError, match="no batch column 'donor'"):
        scoring_subsample(obs, "donor", None, 100)


@pytest.mark.parametrize("bad", [1, 0, -5, 1.5, "1.5", "many", True, None])
def test_max_samples_must_be_an_integer_of_two_or_more(bad) -> None:
    with pytest.raises(InputError, match="max_samples: expected an integer >= 2"):
        check_max_samples(bad)
    assert check_max_samples("2") == 2 and check_max_samples(np.int64(7)) == 7


# --------------------------------------------------------------------------- scoring


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """180 samples (2 batches x 3 labels x 30): uncorrected, ComBat, ComBat reversed."""
    tmp = tmp_path_factory.mktemp("subsample")
    adata = synthetic_groups()
    results = {
        "uncorrected": run_method("uncorrected", adata, "batch", seed=0),
        "combat": run_method("combat", adata, "batch", seed=0),
    }
    # Samples in another order than the uncorrected result's: cut to the same samples.
    results["reversed"] = results["combat"][::-1].copy()
    paths = {m: tmp / f"{m}.h5ad" for m in results}
    for m, result in results.items():
        write_result(result, paths[m])
    return {"dir": tmp, "results": results, "paths": paths}


def test_every_method_is_scored_on_the_same_rows(files) -> None:
    paths, results = files["paths"], files["results"]
    outs = {m: files["dir"] / "sub" / f"{m}.tsv" for m in paths}
    steps_metrics.run_dataset_metrics(
        paths, paths["uncorrected"], "batch", "cell_type", outs, seed=3, max_samples=60
    )
    unc = results["uncorrected"]
    rows = scoring_subsample(unc.obs, "batch", "cell_type", 60, seed=3)
    assert unc.obs.loc[rows].groupby(["batch", "cell_type"], observed=True).size().eq(10).all()
    cut_unc = unc[rows].copy()
    cut_unc.uns["method"] = "uncorrected"
    for m, path in outs.items():
        table = tables.read_metrics(path)
        tail = table[table["type"] == "subsample"]
        assert list(tail["metric"]) == list(SUBSAMPLE_METRICS)
        assert list(tail["value"]) == [60.0, 180.0, 3.0]
        # the same values as scoring the cut data without a limit: the same rows
        result = results[m]
        cut = cut_unc if m == "uncorrected" else result[result.obs_names.isin(rows)].copy()
        cut.uns["method"] = m
        alone = metrics.score_method(cut, cut_unc, "batch", "cell_type", seed=3)
        scored = table[table["type"] != "subsample"].reset_index(drop=True)
        pd.testing.assert_frame_equal(scored, alone, check_dtype=False)
        assert scored["value"].notna().all(), m


def test_the_representations_scored_are_written_for_the_report(files) -> None:
    paths, results = files["paths"], files["results"]
    outs = {m: files["dir"] / "reps" / f"{m}.tsv" for m in paths}
    reps = files["dir"] / "reps" / "representations.h5ad"
    steps_metrics.run_dataset_metrics(
        paths,
        paths["uncorrected"],
        "batch",
        "cell_type",
        outs,
        seed=3,
        max_samples=60,
        out_representations=reps,
    )
    stored = ad.read_h5ad(reps)
    rows = scoring_subsample(results["uncorrected"].obs, "batch", "cell_type", 60, seed=3)
    assert list(stored.obs_names) == list(rows) and stored.uns["seed"] == 3
    assert set(stored.obsm) == {"X_uncorrected", "X_combat", "X_reversed"}
    for m in ("uncorrected", "combat"):
        cut = results[m][rows]  # the uncorrected result's order, as scored
        expected = metrics.scoring_representation(cut, seed=3)
        np.testing.assert_array_equal(stored.obsm[f"X_{m}"], expected)
    # a method scored in another row order is put back in the file's: its PCA (of the
    # same rows in reverse) is the combat one up to the solver's rounding
    np.testing.assert_allclose(
        np.abs(stored.obsm["X_reversed"]), np.abs(stored.obsm["X_combat"]), atol=1e-4
    )
    # what the report takes: a method's rows in the order asked, nothing for the unknown
    some = pd.Index(rows[::-7])
    where = stored.obs_names.get_indexer(some)
    read = read_representations(reps)
    np.testing.assert_array_equal(
        stored_representation(read, "combat", some), stored.obsm["X_combat"][where]
    )
    assert stored_representation(read, "harmony", some) is None
    assert stored_representation(read, "combat", pd.Index(["not-scored"])) is None
    assert read_representations(None) is None
    assert stored_representation(None, "combat", some) is None
    (files["dir"] / "reps" / "broken.h5ad").write_text("not hdf5")
    with pytest.raises(InputError, match=r"broken\.h5ad: cannot read the scored representations"):
        read_representations(files["dir"] / "reps" / "broken.h5ad")


def test_up_to_max_samples_the_tables_are_unchanged(files) -> None:
    paths, n = files["paths"], files["results"]["uncorrected"].n_obs
    texts = []
    for name, limit in (("default", None), ("n", str(n)), ("large", "1000000")):
        out = files["dir"] / name / "combat.tsv"
        argv = ["metrics", "--uncorrected", str(paths["uncorrected"]), "--batch-key", "batch"]
        argv += ["--label-key", "cell_type", "--seed", "0"]
        argv += ["--result", f"combat={paths['combat']}", "--out", f"combat={out}"]
        assert main(argv + (["--max-samples", limit] if limit else [])) == 0
        texts.append(out.read_text())
    assert texts[0] == texts[1] == texts[2]
    assert "subsample" not in texts[0]


def test_the_default_is_the_same_in_the_cli_and_the_config_schema() -> None:
    argv = ["metrics", "--result", "a=a.h5ad", "--uncorrected", "u.h5ad", "--batch-key", "b"]
    args = build_parser().parse_args([*argv, "--out", "a=a.tsv"])
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    limit = schema["properties"]["metrics"]["properties"]["max_samples"]
    assert args.max_samples == limit["default"] == DEFAULT_MAX_SAMPLES
    assert limit["minimum"] == 2


@pytest.mark.parametrize("bad", ["1", "0", "2.5", "lots"])
def test_a_bad_max_samples_is_refused_in_one_line(files, capsys, bad) -> None:
    out = files["dir"] / "bad" / "combat.tsv"
    paths = files["paths"]
    argv = ["metrics", "--uncorrected", str(paths["uncorrected"]), "--batch-key", "batch"]
    argv += ["--result", f"combat={paths['combat']}", "--out", f"combat={out}"]
    assert main([*argv, "--max-samples", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"locusformer metrics: error: --max-samples: expected an integer >= 2, got {bad!r}"
    ]
    assert not out.exists()


def test_kmeans_starts_reach_the_scores_through_the_cli(files, capsys) -> None:
    paths, combat = files["paths"], files["results"]["combat"]
    argv = ["metrics", "--uncorrected", str(paths["uncorrected"]), "--batch-key", "batch"]
    argv += ["--label-key", "cell_type", "--result", f"combat={paths['combat']}"]
    out = files["dir"] / "starts" / "combat.tsv"
    assert main([*argv, "--out", f"combat={out}", "--kmeans-starts", "10"]) == 0
    table = tables.read_metrics(out).set_index("metric")["value"]
    x = metrics.scoring_representation(combat, 0)
    want = metrics.kmeans_nmi_ari(x, combat.obs["cell_type"].astype(str).to_numpy(), 10)
    assert table["KMeans NMI"] == pytest.approx(want["nmi"], abs=1e-6)
    assert table["KMeans ARI"] == pytest.approx(want["ari"], abs=1e-6)
    bad = files["dir"] / "starts0" / "combat.tsv"
    assert main([*argv, "--out", f"combat={bad}", "--kmeans-starts", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["locusformer metrics: error: --kmeans-starts: expected an integer >= 1, got '0'"]
    assert not bad.exists()


def test_ten_kmeans_starts_are_the_default_of_the_library_cli_and_config_schema() -> None:
    argv = ["metrics", "--result", "a=a.h5ad", "--uncorrected", "u.h5ad", "--batch-key", "b"]
    args = build_parser().parse_args([*argv, "--out", "a=a.tsv"])
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    starts = schema["properties"]["metrics"]["properties"]["kmeans_starts"]
    default = metrics.check_kmeans_starts(args.kmeans_starts)
    assert default == starts["default"] == metrics.DEFAULT_KMEANS_STARTS == 10
    config = yaml.safe_load((ROOT / "config/config.yaml").read_text())
    assert config["metrics"]["kmeans_starts"] == 10


# --------------------------------------------------------------------------- the report


def long_table(with_labels: bool, subsample: tuple[int, int, int] | None) -> pd.DataFrame:
    names = metrics.metric_names(with_labels)
    frames = []
    for k, method in enumerate(("uncorrected", "combat")):
        values = {m: 0.5 + 0.1 * k for m, _ in names}
        df = metrics._rows(method, values, with_labels, "ok", "")
        if subsample is not None:
            n, total, seed = subsample
            df = with_subsample_rows(df, pd.Index(range(n)), total, seed)
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def test_the_report_says_which_subsample_was_scored(tmp_path: Path) -> None:
    said = "Scored on a stratified subsample of 50000 of 1000000 samples"
    assert subsample_sentence(long_table(True, (50000, 1000000, 7))) == (
        f"{said} (by batch and label, seed 7)."
    )
    assert subsample_sentence(long_table(False, (50000, 1000000, 0))) == (
        f"{said} (by batch, seed 0)."
    )
    assert subsample_sentence(long_table(True, None)) == ""

    path = tmp_path / "metrics.tsv"
    long_table(True, (50000, 1000000, 7)).to_csv(path, sep="\t", index=False)
    section = metrics_section(path)
    assert section["subsample"].startswith(said)
    html = render_dataset_report(tmp_path / "report.html", dataset="d", metrics_tsv=path)
    assert f'<p id="metrics-subsample">{said} (by batch and label, seed 7).</p>' in html
    assert "Samples scored" not in html
    assert [c["name"] for c in section["columns"]] == [m for m, _ in metrics.metric_names(True)]
    long_table(True, None).to_csv(path, sep="\t", index=False)
    assert metrics_section(path)["subsample"] == ""
