"""benchmarks/simulated/suite.py's bookkeeping: which rows a resumed run skips, how
LocusFormer's rows are named when it trains with overrides, and which block of the results
document its rows are written to, and what a microarray study is handed. Only ComBat and
the uncorrected data are run."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "simulated"))
sys.path.insert(0, str(ROOT / "benchmarks"))
import results_tables
import suite


def test_overrides_name_locusformers_rows_and_nothing_else():
    assert suite.method_label("locusformer", None) == "locusformer"
    assert suite.method_label("locusformer", {"min_steps": 300}) == 'locusformer {"min_steps": 300}'
    assert suite.method_label("combat", {"min_steps": 300}) == "combat"


def test_a_resumed_run_skips_scored_rows_only(tmp_path):
    assert suite.finished(tmp_path) == set()
    rows = [
        "middle\tcombat\t0\t0.8\t0.9\t0.86\t1.0",
        "middle\tlocusformer\t0\tnan\tnan\tnan\t2.0",  # failed: run again
        'middle\tlocusformer {"min_steps": 300}\t1\t0.7\t0.9\t0.82\t3.0',
        "n-40\tcombat\t2\t0.6\t0.8\t0.72\t1.0",
    ]
    (tmp_path / "results.tsv").write_text("\n".join(rows) + "\n")
    assert suite.finished(tmp_path) == {
        ("middle", "combat", 0),
        ("middle", 'locusformer {"min_steps": 300}', 1),
        ("n-40", "combat", 2),
    }


def test_the_shallow_rows_go_to_their_own_block_and_leave_the_suites_alone(tmp_path, monkeypatch):
    rows = [
        "n-3000 (shallow)\tcombat\t0\t0.8\t0.7\t0.74\t0.2",
        "n-3000 (shallow)\tlocusformer\t0\t0.9\t0.8\t0.84\t75.0",
    ]
    (tmp_path / "results.tsv").write_text("\n".join(rows) + "\n")
    run = {"date": "2026-12-06", "commit": "abc1234", "dirty": False, "machine": "a CPU"}
    (tmp_path / "runs.jsonl").write_text(json.dumps({**run, "threads": 1}) + "\n")
    doc = tmp_path / "results.md"
    suite_block = "<!-- table:simulated -->\nthe suite\n<!-- /table:simulated -->"
    doc.write_text(
        f"{suite_block}\n\n<!-- table:simulated-shallow -->\nstale\n"
        "<!-- /table:simulated-shallow -->\n"
    )
    monkeypatch.setitem(results_tables.DOCUMENTS, "simulated-shallow", [doc])
    monkeypatch.setattr(results_tables, "ROOT", tmp_path)
    argv = ["results_tables.py", "simulated", "--work", str(tmp_path)]
    monkeypatch.setattr(sys, "argv", [*argv, "--block", "simulated-shallow"])
    results_tables.main()
    text = doc.read_text()
    assert suite_block in text and "stale" not in text
    assert "| n-3000 (shallow) | **0.840 (1 seed)** | 0.740 (1 seed) |" in text
    monkeypatch.setattr(sys, "argv", [*argv, "--block", "simulated-shallow", "--check"])
    results_tables.main()  # the same now: exits normally
    monkeypatch.setattr(sys, "argv", [*argv, "--block", "nonsense"])
    with pytest.raises(SystemExit):
        results_tables.main()


def test_a_default_measured_under_its_overrides_is_read_as_locusformer(tmp_path):
    """``--locusformer JSON``: the rows trained with those overrides are LocusFormer's, the
    rows without them and their runs go unshown, and the text says which runs they are."""
    training = '{"input_cluster_softness": 0.1}'
    rows = [
        "middle\tcombat\t0\t0.8\t0.7\t0.74\t0.2",
        "middle\tlocusformer\t0\t0.9\t0.8\t0.84\t75.0",
        f"middle\tlocusformer {training}\t0\t0.9\t0.9\t0.90\t70.0",
    ]
    (tmp_path / "results.tsv").write_text("\n".join(rows) + "\n")
    run = {"date": "2026-12-06", "dirty": False, "machine": "a CPU", "threads": 1}
    runs = [
        {**run, "commit": "base000", "methods": ["combat"], "training": None},
        {**run, "commit": "hard000", "methods": ["locusformer"], "training": None},
        {**run, "commit": "soft000", "methods": ["locusformer"], "training": json.loads(training)},
    ]
    (tmp_path / "runs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in runs))
    plain = results_tables.simulated_rows(tmp_path)
    assert set(plain["method"]) == {"combat", "locusformer", f"locusformer {training}"}
    read = results_tables.simulated_rows(tmp_path, training)
    assert set(read["method"]) == {"combat", "locusformer"}
    assert read.loc[read["method"] == "locusformer", "total"].tolist() == [0.90]
    text = results_tables.simulated_text(tmp_path, read, training)
    assert "soft000" in text and "base000" in text and "hard000" not in text
    assert f"its runs trained with {training}, its defaults" in text
    assert "| middle | **0.900 (1 seed)** | 0.740 (1 seed) |" in text


def test_a_microarray_study_is_corrected_as_log_expression_and_skips_the_count_models(tmp_path):
    from locusformer.simulate.scenarios import SUITE

    scenario = dataclasses.replace(
        SUITE["bulk-6-batches"].scaled(0.1, n_genes=300), library="microarray"
    )
    adata, counts, loci = suite.prepare(scenario, 0)
    assert counts is None  # scVI's input: a microarray has none
    assert "counts" not in adata.layers and adata.X.min() > 2.0  # log2 intensities as given
    assert list(adata.var_names) == loci["gene_id"].tolist()
    suite.run_one("arrays", scenario, 0, ["uncorrected", "combat", "scvi"], None, tmp_path)
    rows = (tmp_path / "results.tsv").read_text().splitlines()
    assert [row.split("\t")[1] for row in rows] == ["uncorrected", "combat"]
    assert all(0 < float(row.split("\t")[5]) <= 1 for row in rows)
