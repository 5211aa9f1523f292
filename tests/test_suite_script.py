"""benchmarks/simulated/suite.py's bookkeeping: which rows a resumed run skips, and how
LocusFormer's rows are named when it trains with overrides. No method is run."""

from __future__ import annotations

import sys

from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks" / "simulated"))
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
