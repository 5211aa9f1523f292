"""The design check: how strongly batch predicts biology, and what the reports make of it."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats.contingency import association

from locusformer.cli.main import main
from locusformer.errors import InputError
from locusformer.report import render as report
from locusformer.report import sections as report_sections
from locusformer.scoring import confounding
from locusformer.steps.confounding import run_confounding

# --------------------------------------------------------------------------- statistics


def test_a_perfectly_confounded_design_has_v_1_and_every_label_in_one_batch() -> None:
    batches = ["b0"] * 30 + ["b1"] * 20 + ["b2"] * 10
    labels = ["t0"] * 30 + ["t1"] * 20 + ["t2"] * 10
    stats = confounding.label_statistics(batches, labels)
    assert stats["cramers_v"] == pytest.approx(1.0)
    assert stats["cramers_v_classic"] == pytest.approx(1.0)
    assert stats["share_labels_one_batch"] == 1.0
    assert stats["share_samples_one_batch"] == 1.0
    assert stats["one_batch_labels"] == {"t0": "b0", "t1": "b1", "t2": "b2"}
    level, reasons = confounding.design_level(stats)
    assert level == "confounded" and len(reasons) == 3


def test_a_balanced_design_has_v_0() -> None:
    batches = ["b0"] * 40 + ["b1"] * 40
    labels = (["t0"] * 10 + ["t1"] * 30) * 2  # the same mixture in both batches
    stats = confounding.label_statistics(batches, labels)
    assert stats["cramers_v"] == pytest.approx(0.0, abs=1e-12)
    assert stats["share_labels_one_batch"] == 0.0
    assert stats["batches_of_label"] == {"t0": ["b0", "b1"], "t1": ["b0", "b1"]}
    assert confounding.design_level(stats)[0] == "balanced"


def test_bias_correction_brings_a_random_small_design_close_to_0() -> None:
    rng = np.random.default_rng(3)
    batches = rng.choice(["b0", "b1", "b2", "b3"], size=60)
    labels = rng.choice(["t0", "t1", "t2", "t3", "t4"], size=60)  # independent of batch
    table = confounding.contingency(batches, labels)
    classic = confounding.cramers_v(table, bias_corrected=False)
    corrected = confounding.cramers_v(table)
    assert classic == pytest.approx(association(table.to_numpy(), method="cramer"))
    assert corrected < 0.1 < classic  # the classic V reads chance structure as association


def test_cramers_v_of_a_known_2x2_table() -> None:
    table = np.array([[30, 10], [10, 30]])
    assert confounding.cramers_v(table, bias_corrected=False) == pytest.approx(0.5)
    n = 80
    expected = math.sqrt((0.25 - 1 / (n - 1)) / (1 - 1 / (n - 1)))  # Bergsma (2013)
    assert confounding.cramers_v(table) == pytest.approx(expected)
    assert math.isnan(confounding.cramers_v(np.array([[5, 5], [0, 0]])))  # one batch


def test_levels_follow_the_documented_thresholds() -> None:
    # one rare label seen in one batch only, the rest balanced: imbalanced, not confounded
    batches = ["b0"] * 50 + ["b1"] * 50
    labels = (["t0"] * 25 + ["t1"] * 25) + (["t0"] * 22 + ["t1"] * 25 + ["rare"] * 3)
    stats = confounding.label_statistics(batches, labels)
    assert stats["cramers_v"] < confounding.IMBALANCED_V
    assert stats["one_batch_labels"] == {"rare": "b1"}
    assert confounding.design_level(stats) == ("imbalanced", ["1 label found in one batch only"])
    # two of three labels in one batch only: confounded whatever V says
    labels = (["t0"] * 25 + ["t1"] * 25) + (["t0"] * 25 + ["t2"] * 25)
    stats = confounding.label_statistics(batches, labels)
    assert stats["share_labels_one_batch"] == pytest.approx(2 / 3)
    assert confounding.design_level(stats)[0] == "confounded"
    # shifted mixtures, every label in both batches: V decides
    labels = (["t0"] * 40 + ["t1"] * 10) + (["t0"] * 15 + ["t1"] * 35)
    stats = confounding.label_statistics(batches, labels)
    assert confounding.IMBALANCED_V <= stats["cramers_v"] < confounding.CONFOUNDED_V
    assert confounding.design_level(stats)[0] == "imbalanced"
    assert confounding.design_level(None)[0] == "unknown"


def test_batch_r2_known_answers() -> None:
    batches = ["a", "a", "b", "b"]
    scores = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    per, weighted = confounding.batch_r2(scores, batches)
    np.testing.assert_allclose(per, [1.0, 0.0])
    assert weighted == pytest.approx(0.5)  # equal variances: the plain mean
    scores[:, 1] *= 3  # the batch-free axis now holds 9/10 of the variance
    assert confounding.batch_r2(scores, batches)[1] == pytest.approx(0.1)


def test_label_free_r2_is_high_with_a_planted_batch_shift_and_low_on_noise() -> None:
    rng = np.random.default_rng(0)
    batches = np.repeat(["b0", "b1", "b2"], 60)
    noise = rng.normal(size=(180, 80))
    pure = confounding.pca_statistics(noise, batches)
    shifted = noise + np.repeat(rng.normal(0, 1.5, (3, 80)), 60, axis=0)
    planted = confounding.pca_statistics(shifted, batches)
    assert pure["n_pcs"] == 50 and len(pure["r2_per_pc"]) == 50  # the metrics' n_pcs rule
    assert pure["weighted_r2"] < 0.05 and pure["chance_r2"] == pytest.approx(2 / 179)
    assert planted["weighted_r2"] > 0.5
    assert min(planted["r2_per_pc"][:2]) > 0.9  # the shift is the top two PCs


def test_assess_without_labels_flags_a_batch_dominated_design() -> None:
    rng = np.random.default_rng(1)
    batches = np.repeat(["b0", "b1"], 40)
    x = rng.normal(size=(80, 30)) + np.repeat([[0.0], [4.0]], 40, axis=0)
    check = confounding.assess(batches, None, x)
    assert check["level"] == "unknown" and check["labels"] is None
    assert check["batch_dominated"]
    assert any("cannot be measured" in s for s in check["sentences"])
    quiet = confounding.assess(batches, None, rng.normal(size=(80, 30)))
    assert not quiet["batch_dominated"] and quiet["sentences"] == []


def test_describe_names_which_batches_hold_which_labels() -> None:
    batches = ["b0"] * 20 + ["b1"] * 20
    labels = ["t0"] * 10 + ["t1"] * 10 + ["t0"] * 10 + ["t2"] * 10
    check = confounding.assess(batches, labels)
    assert check["level"] == "confounded"
    text = " ".join(check["sentences"])
    assert "Only batch b0 holds label(s) t1." in text
    assert "Only batch b1 holds label(s) t2." in text
    assert "more than one batch: t0" in text
    assert "may remove biology" in text and "mod" in text


# --------------------------------------------------------------------------- files and CLI


def write_inputs(d: Path, batches, labels, x: np.ndarray) -> tuple[Path, Path]:
    d.mkdir(parents=True, exist_ok=True)
    ids = pd.Index([f"s{i}" for i in range(len(batches))], name="sample_id")
    pd.DataFrame(x, index=ids, columns=[f"G{j}" for j in range(x.shape[1])]).astype(
        np.float32
    ).to_parquet(d / "normalized.parquet")
    pd.DataFrame({"batch": batches, "cell_type": labels}, index=ids).to_csv(
        d / "samples.tsv", sep="\t"
    )
    return d / "normalized.parquet", d / "samples.tsv"


def test_cli_writes_the_check_as_json(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    batches = np.repeat(["b0", "b1"], 30)
    labels = np.repeat(["t0", "t1"], 30)
    x = rng.normal(size=(60, 20)) + np.repeat([[0.0], [3.0]], 30, axis=0)
    matrix, samples = write_inputs(tmp_path, batches, labels, x)
    out = tmp_path / "confounding.json"
    args = ["confounding", "--matrix", str(matrix), "--samples", str(samples)]
    assert main([*args, "--batch-key", "batch", "--label-key", "cell_type", "--out", str(out)]) == 0
    check = json.loads(out.read_text())
    assert check["level"] == "confounded" and check["labels"]["cramers_v"] == pytest.approx(1.0)
    assert check["pca"]["n_pcs"] == 19 and check["pca"]["weighted_r2"] > 0.5
    assert check["label_key"] == "cell_type" and check == confounding.read_confounding(out)
    # a subsample for the PCA keeps every sample for the label statistics
    small = run_confounding(matrix, samples, "batch", None, tmp_path / "c2.json", max_samples=20)
    assert small["pca"]["n_samples_used"] == 20 and small["n_samples"] == 60
    assert small["level"] == "unknown"


def test_bad_input_is_one_line_naming_the_file(tmp_path: Path, capsys) -> None:
    matrix, samples = write_inputs(
        tmp_path, ["b0", "b1"] * 5, ["t0"] * 10, np.zeros((10, 4), dtype=np.float32)
    )
    out = tmp_path / "c.json"
    args = ["confounding", "--matrix", str(matrix), "--samples", str(samples)]
    rc = main([*args, "--batch-key", "nope", "--out", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1
    assert str(samples) in err[0] and "no column 'nope'" in err[0]
    assert not out.exists()
    (tmp_path / "bad.json").write_text('{"level": "maybe"}')
    with pytest.raises(InputError, match=r"bad\.json: not a confounding check"):
        confounding.read_confounding(tmp_path / "bad.json")


# --------------------------------------------------------------------------- reports


def write_metrics(path: Path, totals: dict[str, float | None]) -> Path:
    """A long metrics table whose aggregates give each method the total asked for."""
    rows = []
    for method, total in totals.items():
        status = "ok" if total is not None else "failed"
        value = float("nan") if total is None else total
        for metric, kind in (
            ("KMeans ARI", "bio"),
            ("iLISI", "batch"),
            ("Batch correction", "aggregate"),
            ("Bio conservation", "aggregate"),
            ("Total", "aggregate"),
        ):
            rows.append((method, metric, kind, value, status, "" if total is not None else "boom"))
    pd.DataFrame(rows, columns=["method", "metric", "type", "value", "status", "error"]).to_csv(
        path, sep="\t", index=False
    )
    return path


def confounded_check(d: Path) -> Path:
    batches = ["b0"] * 20 + ["b1"] * 20
    labels = ["t0"] * 20 + ["t1"] * 20
    path = d / "confounding.json"
    path.write_text(json.dumps(confounding._finite(confounding.assess(batches, labels))))
    return path


def test_report_of_a_confounded_dataset_says_so_at_the_top(tmp_path: Path) -> None:
    metrics = write_metrics(
        tmp_path / "metrics.tsv", {"uncorrected": 0.70, "combat": 0.65, "harmony": 0.60}
    )
    html = report.render_dataset_report(
        tmp_path / "r.html",
        dataset="d",
        metrics_tsv=metrics,
        confounding_json=confounded_check(tmp_path),
    )
    top = html[: html.index("<nav>")]
    assert 'id="confounding-warning"' in top and "Confounded design" in top
    assert "Only batch b0 holds label(s) t0." in top and "Only batch b1 holds label(s) t1." in top
    assert "may remove biology" in top and "ComBat&#39;s mod" in top
    assert "Leaving the data uncorrected scored best (total 0.700)" in top
    assert "the best correction, combat, scored 0.650" in top
    assert '<strong id="design-level">confounded</strong>' in html
    # a balanced design gets no warning
    balanced = tmp_path / "balanced.json"
    balanced.write_text(
        json.dumps(confounding.assess(["b0", "b1"] * 20, ["t0"] * 20 + ["t1"] * 20))
    )
    calm = report.render_dataset_report(
        tmp_path / "r2.html", dataset="d", metrics_tsv=metrics, confounding_json=balanced
    )
    assert "confounding-warning" not in calm and "confounding-note" not in calm
    assert '<strong id="design-level">balanced</strong>' in calm


def test_verdict_never_crowns_a_correction_below_uncorrected() -> None:
    def scores(**totals):
        return pd.DataFrame(
            [
                {"method": m, "total": t, "status": "ok" if t is not None else "failed"}
                for m, t in totals.items()
            ]
        )

    below = report_sections.verdict(scores(uncorrected=0.7, combat=0.65, harmony=None))
    assert below["crowned"] == "uncorrected" and below["uncorrected_best"]
    assert below["best_correction"] == "combat"
    above = report_sections.verdict(scores(uncorrected=0.7, combat=0.65, harmony=0.72))
    assert above["crowned"] == "harmony" and not above["uncorrected_best"]
    assert above["sentence"] == "harmony scored best (total 0.720; uncorrected 0.700)."
    tie = report_sections.verdict(scores(uncorrected=0.7, combat=0.7))
    assert tie["crowned"] == "uncorrected"
    alone = report_sections.verdict(scores(uncorrected=0.7, combat=None))
    assert alone["crowned"] == "uncorrected" and "no correction has a score" in alone["sentence"]
    assert report_sections.verdict(scores(combat=0.5, harmony=0.6))["crowned"] == "harmony"
    assert report_sections.verdict(scores(combat=None)) is None


def test_summary_page_does_not_crown_a_method_below_uncorrected(tmp_path: Path) -> None:
    from locusformer.steps.summarize import summarize

    low = write_metrics(tmp_path / "low.tsv", {"uncorrected": 0.70, "combat": 0.65})
    high = write_metrics(tmp_path / "high.tsv", {"uncorrected": 0.50, "harmony": 0.60})
    summarize({"conf": low, "fine": high}, {}, tmp_path / "summary.tsv")
    html = report.render_index(
        tmp_path / "summary.tsv",
        {"conf": "conf/report.html", "fine": "fine/report.html"},
        tmp_path / "index.html",
        confounding={"conf": confounded_check(tmp_path)},
    )
    table = html[html.index('<table id="summary-table">') :]
    rows = [r for r in table.split("<tr") if 'class="name">' in r and "<td" in r]
    crowned = [r for r in rows if 'class="best"' in r]
    assert len(crowned) == 2
    assert ">uncorrected</td>" in crowned[0] and ">conf</a>" in crowned[0]
    assert ">harmony</td>" in crowned[1]
    assert not any(">combat</td>" in r for r in crowned)
    assert "Leaving the data uncorrected scored best (total 0.700)" in html
    assert "harmony scored best (total 0.600; uncorrected 0.500)" in html
    assert '<strong class="design-confounded">confounded</strong>' in html
    assert "Confounded design (" in html and "correcting may remove biology" in html
