"""Above max_samples only the subsample's rows are read (issue 15): the metrics, the report."""

from __future__ import annotations

from pathlib import Path

import anndata as ad
import h5py
import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp
from conftest import synthetic_groups

from locusformer.baselines.methods import run_method
from locusformer.cli.main import main
from locusformer.errors import InputError
from locusformer.io.results import EMBEDDING_KEY, make_result, write_result
from locusformer.report import sections as report_sections
from locusformer.report.render import render_dataset_report
from locusformer.scoring import metrics, result_rows, tables
from locusformer.scoring.subsample import scoring_subsample
from locusformer.steps import metrics as steps_metrics

LIMIT, SEED = 30, 3


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict:
    """180 samples (2 batches x 3 labels x 30): uncorrected, ComBat, ComBat reversed and an
    embedding result (its samples shuffled), written as the workflow writes them."""
    tmp = tmp_path_factory.mktemp("scale_reading")
    adata = synthetic_groups()
    combat = run_method("combat", adata, "batch", seed=0)
    order = np.random.default_rng(0).permutation(adata.n_obs)
    results = {
        "uncorrected": run_method("uncorrected", adata, "batch", seed=0),
        "combat": combat,
        "reversed": combat[::-1].copy(),
        "embedded": make_result(
            None,
            method="embedded",
            representation="embedding",
            obs=combat.obs.iloc[order],
            embedding=np.asarray(combat.X)[order, :8],
            batch_key="batch",
            label_key="cell_type",
        ),
    }
    paths = {m: tmp / f"{m}.h5ad" for m in results}
    for m, result in results.items():
        write_result(result, paths[m])
    keep = scoring_subsample(results["uncorrected"].obs, "batch", "cell_type", LIMIT, SEED)
    return {"dir": tmp, "paths": paths, "keep": keep}


def score(files: dict, name: str, limit: int = LIMIT, only=None) -> dict[str, str]:
    """The metrics job's TSVs (method -> text), into ``name``; ``only`` some methods."""
    paths = {m: p for m, p in files["paths"].items() if only is None or m in only}
    outs = {m: files["dir"] / name / f"{m}.tsv" for m in paths}
    steps_metrics.run_dataset_metrics(
        paths, paths["uncorrected"], "batch", "cell_type", outs, seed=SEED, max_samples=limit
    )
    return {m: path.read_text() for m, path in outs.items()}


@pytest.fixture(scope="module")
def scored(files) -> dict[str, str]:
    return score(files, "rows")


def no_whole_reads(monkeypatch) -> None:
    """Make reading a result whole fail: a test that passes then read rows only."""

    def refuse(*args, **kwargs):
        raise AssertionError(f"a result was read whole: {args}")

    monkeypatch.setattr(ad, "read_h5ad", refuse)


def test_the_scores_are_those_of_the_results_read_whole_then_cut(files, scored) -> None:
    # The previous code path: every result read whole, score_method cutting each to the
    # subsample by a boolean mask, the uncorrected PCA shared as the metrics job shares it.
    paths, keep = files["paths"], files["keep"]
    whole = {m: ad.read_h5ad(path) for m, path in paths.items()}
    reference: dict = {}
    for m, result in whole.items():
        result.uns["method"] = m
        df = metrics.score_method(
            result, whole["uncorrected"], "batch", "cell_type", SEED, reference, keep
        )
        out = files["dir"] / "whole" / f"{m}.tsv"
        tables.write_metrics(df, out)
        assert scored[m] == out.read_text(), m  # byte-identical
        assert "Samples scored\tsubsample\t30.0" in scored[m]
        assert df.loc[df["type"] != "subsample", "value"].notna().any(), m


def test_only_the_subsample_rows_are_read(files, scored, monkeypatch) -> None:
    no_whole_reads(monkeypatch)
    reads: list[tuple[Path, str, np.ndarray]] = []
    read_rows = result_rows.read_rows

    def spy(path: Path, key: str, positions: np.ndarray):
        reads.append((Path(path), key, np.asarray(positions)))
        return read_rows(path, key, positions)

    monkeypatch.setattr(result_rows, "read_rows", spy)
    assert score(files, "spied") == scored
    keep, paths = set(files["keep"]), files["paths"]
    # every result once; the uncorrected also for its PCA, once per order of the samples
    stems = [path.stem for path, _, _ in reads]
    assert {m: stems.count(m) for m in paths} == {
        "uncorrected": 4, "combat": 1, "reversed": 1, "embedded": 1
    }  # fmt: skip
    for path, key, positions in reads:
        obs_names = result_rows.open_result(path).obs_names
        assert key == (f"obsm/{EMBEDDING_KEY}" if path.stem == "embedded" else "X")
        assert len(positions) == LIMIT and (np.diff(positions) > 0).all()
        assert set(obs_names[positions]) == keep, path.stem


def test_up_to_the_limit_the_results_are_read_whole(files, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("rows read below the limit")

    monkeypatch.setattr(result_rows, "read_rows", refuse)
    tables = score(files, "all", limit=180, only=("uncorrected", "combat"))
    assert all("subsample" not in text for text in tables.values())


def test_rows_read_from_disk_equal_the_rows_cut_in_memory(files, tmp_path: Path) -> None:
    paths, keep = files["paths"], files["keep"]
    for m in ("reversed", "embedded"):
        whole = ad.read_h5ad(paths[m])
        opened = result_rows.open_result(paths[m])
        for given in (False, True):
            mine = result_rows.take(opened, keep, m, in_given_order=given)
            theirs = result_rows.take(whole, keep, m, in_given_order=given)
            assert mine.obs_names.equals(theirs.obs_names) and len(mine.obs_names) == LIMIT
            pd.testing.assert_frame_equal(mine.obs, pd.DataFrame(theirs.obs))
            a, b = metrics.scoring_representation(mine), metrics.scoring_representation(theirs)
            assert a.dtype == b.dtype and np.array_equal(a, b)
    # a sparse matrix (not what make_result writes, but an h5ad may hold one)
    dense = ad.read_h5ad(paths["combat"])
    sparse = dense.copy()
    sparse.X = sp.csr_matrix(np.asarray(dense.X))
    sparse.write_h5ad(tmp_path / "sparse.h5ad")
    cut = result_rows.take(result_rows.open_result(tmp_path / "sparse.h5ad"), keep, "s")
    np.testing.assert_array_equal(cut.X.toarray(), np.asarray(dense[keep].X))
    more = keep.append(pd.Index(["not a sample"]))
    with pytest.raises(InputError, match="'c' lacks samples of the subsample"):
        result_rows.take(result_rows.open_result(paths["combat"]), more, "c")


def test_the_report_draws_the_embeddings_of_the_scored_subsample(files, monkeypatch) -> None:
    drawn: dict[str, pd.Index] = {}
    figure = report_sections.embedding_figure

    def spy(coords: np.ndarray, obs: pd.DataFrame, keys, method: str, axis: str) -> str:
        assert coords.shape == (len(obs), 2)
        drawn[method] = obs.index
        return figure(coords, obs, keys, method, axis)

    monkeypatch.setattr(report_sections, "embedding_figure", spy)
    paths, keep = files["paths"], files["keep"]
    out = files["dir"] / "report_all.html"
    html = render_dataset_report(
        out, dataset="d", integrated=paths, seed=SEED, batch_key="batch", label_key="cell_type"
    )
    assert {m: len(names) for m, names in drawn.items()} == {m: 180 for m in paths}
    assert "embeddings-subsample" not in html

    no_whole_reads(monkeypatch)
    drawn.clear()
    html = render_dataset_report(
        out,
        dataset="d",
        integrated=paths,
        seed=SEED,
        batch_key="batch",
        label_key="cell_type",
        max_samples=LIMIT,
    )
    assert set(drawn) == set(paths)
    for m, names in drawn.items():
        assert len(names) == LIMIT and set(names) == set(keep), m
    said = (
        "Drawn from the stratified subsample the scores were computed on: 30 of 180 samples"
        " (by batch and label, seed 3)."
    )
    assert f'<p id="embeddings-subsample">{said}</p>' in html
    # the summary's batch x label table still counts every sample
    assert "<td>30</td>" in html and "<td>5</td>" not in html


def test_the_report_command_passes_max_samples(files, tmp_path: Path, capsys) -> None:
    paths = files["paths"]
    argv = ["report", "--dataset", "d", "--metrics", str(tmp_path / "none.tsv")]
    argv += ["--result", f"uncorrected={paths['uncorrected']}", "--batch-key", "batch"]
    argv += ["--label-key", "cell_type", "--seed", str(SEED), "--out", str(tmp_path / "r.html")]
    pd.DataFrame(columns=tables.COLUMNS).to_csv(tmp_path / "none.tsv", sep="\t", index=False)
    assert main([*argv, "--max-samples", str(LIMIT)]) == 0
    assert "30 of 180 samples (by batch and label, seed 3)" in (tmp_path / "r.html").read_text()
    assert main([*argv, "--max-samples", "1"]) == 2
    assert "--max-samples: expected an integer >= 2" in capsys.readouterr().err


@pytest.mark.parametrize("representation", ["matrix", "embedding"])
def test_locusformer_result_reads_only_the_element_it_keeps(
    representation: str, tmp_path: Path, monkeypatch
) -> None:
    """``locusformer-result`` copies the corrected layer (or the latent) and the sample
    table of correct's .h5ad without reading the file whole (its input matrix above all)."""
    rng = np.random.default_rng(0)
    obs = pd.DataFrame(
        {"batch": ["a", "b"] * 10, "cell_type": ["x"] * 10 + ["y"] * 10},
        index=pd.Index([f"s{i}" for i in range(20)]),
    )
    corrected = ad.AnnData(X=rng.normal(size=(20, 6)).astype(np.float32), obs=obs)
    corrected.var_names = [f"g{j}" for j in range(6)]
    corrected.layers["corrected"] = rng.normal(size=(20, 6)).astype(np.float32)
    corrected.obsm["X_locusformer"] = rng.normal(size=(20, 3)).astype(np.float32)
    corrected.uns["locusformer"] = {"protect": ["cell_type"]}
    corrected.write_h5ad(tmp_path / "locusformer.h5ad")
    no_whole_reads(monkeypatch)
    method = "locusformer" if representation == "matrix" else "locusformer_latent"
    out = tmp_path / f"{method}.h5ad"
    main(
        ["locusformer-result", "--h5ad", str(tmp_path / "locusformer.h5ad"), "--method", method,
         "--representation", representation, "--batch-key", "batch", "--label", "cell_type",
         "--out", str(out)]
    )  # fmt: skip
    with h5py.File(out, "r") as f:
        if representation == "matrix":
            np.testing.assert_array_equal(f["X"][...], corrected.layers["corrected"])
            assert EMBEDDING_KEY not in f["obsm"]
        else:
            np.testing.assert_array_equal(
                f[f"obsm/{EMBEDDING_KEY}"][...], corrected.obsm["X_locusformer"]
            )
            assert "X" not in f
    result = result_rows.open_result(out)
    pd.testing.assert_frame_equal(result.obs.astype(str), obs, check_names=False)
    assert list(result.var_names) == list(corrected.var_names) or representation == "embedding"
    assert result.uns["method"] == method and list(result.uns["covariates"]) == ["cell_type"]


def test_a_missing_element_is_one_input_error(tmp_path: Path) -> None:
    ad.AnnData(X=np.zeros((3, 2), dtype=np.float32)).write_h5ad(tmp_path / "c.h5ad")
    with pytest.raises(InputError, match=r"c\.h5ad.*no 'layers/corrected'"):
        result_rows.read_element(tmp_path / "c.h5ad", "layers/corrected", "corrected .h5ad")
