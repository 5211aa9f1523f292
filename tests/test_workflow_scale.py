"""benchmarks/workflow_scale.py's plan and tables, and results_tables.py's ``scale`` block,
on fabricated runs (run.json, rule benchmarks, summary.tsv): no workflow is run."""

from __future__ import annotations

import json
import sys

import pandas as pd
import pytest
from conftest import ROOT

sys.path.insert(0, str(ROOT / "benchmarks"))
import results_tables
import workflow_scale as ws

# label -> rule -> seconds of repeats r0, r1, r2 (peak RSS: 1024 MB x the repeat + 1)
SECONDS = {
    "reference": {"train": [40.0, 60.0, 50.0], "metrics": [9.0, 12.0, 3.0], "old_rule": [1.0]},
    "current": {"train": [10.0, 30.0, 20.0], "metrics": [4.0, 6.0, 5.0]},
}
WALL = {"reference": [100.0, 80.0, 90.0], "current": [45.0, 30.0, 35.0]}
TOTALS = {"reference": [0.80, 0.70, 0.90], "current": [0.80, 0.85, 0.70]}


def fabricate(out, n=300):
    """Finished runs under ``out`` as run_once and the workflow leave them."""
    for label, rules in SECONDS.items():
        for k in range(3):
            work = ws.work_dir(out, label, n, k)
            bench = work / "logs" / "benchmarks" / "sim"
            bench.mkdir(parents=True)
            for rule, seconds in rules.items():
                if k < len(seconds):
                    row = {"s": seconds[k], "max_rss": 1024.0 * (k + 1), "h:m:s": "0:00:01"}
                    pd.DataFrame([row]).to_csv(bench / f"{rule}.tsv", sep="\t", index=False)
            (work / "results" / "sim").mkdir(parents=True)
            (work / "results" / "sim" / "report.html").write_text("x" * 2000)
            summary = pd.DataFrame(
                {
                    "dataset": "sim",
                    "method": ["locusformer", "combat"],
                    "batch": [0.5, 0.4],
                    "bio": [0.9, 0.8],
                    "total": [TOTALS[label][k], 0.6],
                    "status": "ok",
                    "wall_s": [20.0, 1.0],
                }
            )
            summary.to_csv(work / "results" / "summary.tsv", sep="\t", index=False)
            record = {
                "label": label,
                "size": n,
                "repeat": k,
                "commit": ("a" if label == "reference" else "b") * 40,
                "dirty": label == "current",
                "date": "2027-01-0" + str(k + 1),
                "machine": "a test CPU, 2 cores",
                "cores": 2,
                "workflow_s": WALL[label][k],
            }
            (work / "run.json").write_text(json.dumps(record))


def rows_of(table: str) -> dict[str, list[str]]:
    """A markdown table's body: first cell (bold removed) -> the other cells."""
    body = [line.strip("|").split(" | ") for line in table.splitlines()[2:]]
    return {cells[0].strip(" *"): [c.strip() for c in cells[1:]] for cells in body}


def test_the_plan_interleaves_the_codes_within_each_repeat():
    assert ws.plan([300, 1000], ["reference", "current"], 2) == [
        (300, 0, "reference"),
        (300, 0, "current"),
        (300, 1, "reference"),
        (300, 1, "current"),
        (1000, 0, "reference"),
        (1000, 0, "current"),
        (1000, 1, "reference"),
        (1000, 1, "current"),
    ]
    assert ws.plan([300], ["current"], 1) == [(300, 0, "current")]


def test_codes_pair_with_labels_and_default_to_this_repository(tmp_path):
    assert ws.codes_from(None, None) == {"current": ROOT}
    assert ws.codes_from([ROOT], None) == {"current": ROOT}
    codes = ws.codes_from([ROOT, ROOT], ["reference", "current"])
    assert list(codes) == ["reference", "current"]
    with pytest.raises(SystemExit, match="2 --code but 1 --label"):
        ws.codes_from([ROOT, ROOT], ["reference"])
    with pytest.raises(SystemExit, match="distinct"):
        ws.codes_from([ROOT, ROOT], ["current", "current"])
    with pytest.raises(SystemExit, match="no workflow/Snakefile"):
        ws.codes_from([tmp_path], ["reference"])


def test_collect_reads_every_finished_run_and_skips_unfinished_ones(tmp_path):
    fabricate(tmp_path)
    unfinished = ws.work_dir(tmp_path, "current", 300, 3) / "logs" / "benchmarks"
    unfinished.mkdir(parents=True)  # no run.json: an interrupted run is not read
    pd.DataFrame([{"s": 1e6, "max_rss": 1.0}]).to_csv(unfinished / "train.tsv", sep="\t")
    rules, runs = ws.collect(tmp_path)
    assert len(rules) == 3 * 2 + 3 * 2 + 1
    assert rules["seconds"].max() == 60.0
    train = rules[(rules["label"] == "current") & (rules["rule"] == "train")]
    assert sorted(train["seconds"]) == [10.0, 20.0, 30.0]
    assert len(runs) == 6 * 2  # six runs, two summary rows each
    assert {"dataset", "method", "total", "status", "wall_s"} <= set(runs.columns)
    assert runs["report_mb"].iloc[0] == pytest.approx(0.002)
    one = runs[(runs["label"] == "reference") & (runs["repeat"] == 1)]
    assert set(one["workflow_s"]) == {80.0} and set(one["commit"]) == {"a" * 40}


def test_cost_is_the_median_of_the_runs_and_the_largest_peak(tmp_path):
    fabricate(tmp_path)
    stats = ws.cost(*ws.collect(tmp_path), 300)
    assert stats.loc[("current", "train"), "seconds"] == 20.0
    assert stats.loc[("reference", "train"), "seconds"] == 50.0
    assert stats.loc[("reference", "metrics"), "seconds"] == 9.0
    assert stats.loc[("current", "train"), "gb"] == 3.0  # 3072 MB in r2
    assert stats.loc[("reference", "old_rule"), "runs"] == 1
    assert stats.loc[("current", ws.WHOLE_RUN), "seconds"] == 35.0
    assert stats.loc[("reference", ws.WHOLE_RUN), "seconds"] == 90.0
    assert stats.loc[("current", ws.WHOLE_RUN), "runs"] == 3  # runs, not summary rows


def test_the_cost_table_gives_the_speed_up_reference_over_current(tmp_path):
    fabricate(tmp_path)
    table = ws.cost_table(*ws.collect(tmp_path), 300)
    assert table.splitlines()[0] == (
        "| rule | current: median s | current: max GB | reference: median s"
        " | reference: max GB | speed-up (reference / current) |"
    )
    assert table.splitlines()[1] == "|" + " --- |" * 6
    rows = rows_of(table)
    assert list(rows) == ["train", "metrics", "old_rule", ws.WHOLE_RUN]  # costliest first
    assert rows["train"] == ["20", "3.00", "50", "3.00", "2.50×"]
    assert rows["metrics"] == ["5.0", "3.00", "9.0", "3.00", "1.80×"]
    assert rows["old_rule"] == ["", "", "1.0", "1.00", ""]
    assert rows[ws.WHOLE_RUN] == ["35", "", "90", "", "2.57×"]


def test_the_scores_table_shows_each_codes_median_total(tmp_path):
    fabricate(tmp_path)
    table = ws.score_table(ws.collect(tmp_path)[1], 300)
    rows = rows_of(table)
    assert table.splitlines()[1] == "| --- | --- | --- | --- |"
    assert rows["locusformer"] == ["0.8000", "0.8000", "+0.0000"]
    assert rows["combat"] == ["0.6000", "0.6000", "+0.0000"]
    assert list(rows) == ["locusformer", "combat"]


def test_one_label_alone_has_no_reference_columns(tmp_path):
    fabricate(tmp_path)
    rules, runs = ws.collect(tmp_path)
    rules, runs = rules[rules["label"] == "current"], runs[runs["label"] == "current"]
    text = ws.scale_text(rules, runs)
    assert "reference" not in text and "speed-up" not in text
    assert rows_of(ws.cost_table(rules, runs, 300))["train"] == ["20", "3.00"]
    with pytest.raises(SystemExit, match="no run labelled 'current'"):
        ws.scale_text(rules.assign(label="x"), runs.assign(label="x"))


def test_table_writes_the_tsvs_and_prints_per_size(tmp_path, capsys):
    fabricate(tmp_path, 300)
    fabricate(tmp_path, 1000)
    ws.main(["--out", str(tmp_path), "--table"])
    printed = capsys.readouterr().out
    assert printed.index("**300 samples**: cost") < printed.index("**1,000 samples**: cost")
    assert "2027-01-01 to 2027-01-03" in printed and "a test CPU, 2 cores" in printed
    assert "reference = aaaaaaaaa (3 runs a size)" in printed and "--cores 2`" in printed
    assert "current = bbbbbbbbb (uncommitted changes)" in printed
    rules, runs = ws.read_recorded(tmp_path)
    assert len(rules) == 2 * 13 and len(runs) == 2 * 12
    assert ws.scale_text(rules, runs).strip() == printed.strip()


def test_runs_go_in_the_planned_order_and_a_recorded_run_is_not_rerun(tmp_path, monkeypatch):
    ran = []
    monkeypatch.setattr(ws, "simulate", lambda n, data: data.mkdir(parents=True, exist_ok=True))
    monkeypatch.setattr(ws, "configure", lambda work, data: work.mkdir(parents=True))
    monkeypatch.setattr(ws, "machine", lambda: "a test CPU")
    monkeypatch.setattr(
        ws, "run_workflow", lambda work, code, cores: ran.append((work, code)) or 12.5
    )
    done = ws.work_dir(tmp_path, "reference", 300, 0)
    done.mkdir(parents=True)
    (done / "run.json").write_text("{}")
    stale = ws.work_dir(tmp_path, "current", 300, 0) / "logs" / "old.tsv"
    stale.parent.mkdir(parents=True)
    stale.write_text("partial")
    monkeypatch.setattr(ws, "collect", lambda out: (pd.DataFrame(), pd.DataFrame()))
    codes = ["--code", str(ROOT), "--label", "reference", "--code", str(ROOT), "--label", "current"]
    with pytest.raises(SystemExit, match="no finished run"):  # the fakes ran nothing
        ws.main(["--out", str(tmp_path), "--sizes", "300", "--repeats", "2", *codes])
    assert [w.relative_to(tmp_path).as_posix() for w, _ in ran] == [
        "current/n300/r0",
        "reference/n300/r1",
        "current/n300/r1",
    ]
    assert not stale.exists()  # the interrupted run was emptied, not resumed
    record = json.loads((ws.work_dir(tmp_path, "current", 300, 1) / "run.json").read_text())
    assert record["label"] == "current" and record["repeat"] == 1 and record["size"] == 300
    assert (
        record["workflow_s"] == 12.5 and record["cores"] == 2 and record["machine"] == "a test CPU"
    )
    assert record["commit"] == ws.git("rev-parse", "HEAD") and len(record["commit"]) == 40


def test_results_tables_writes_and_checks_the_scale_block(tmp_path, monkeypatch, capsys):
    fabricate(tmp_path / "out")
    ws.main(["--out", str(tmp_path / "out"), "--table"])
    doc = tmp_path / "results.md"
    doc.write_text(
        "# Results\n\n<!-- table:scale -->\nstale table\n<!-- /table:scale -->\n\nafter\n"
    )
    monkeypatch.setitem(results_tables.DOCUMENTS, "scale", [doc])
    monkeypatch.setattr(results_tables, "ROOT", tmp_path)
    argv = ["results_tables.py", "scale", "--work", str(tmp_path / "out")]
    monkeypatch.setattr(sys, "argv", [*argv, "--check"])
    with pytest.raises(SystemExit) as exit_:
        results_tables.main()
    assert exit_.value.code == 1 and "stale table" in doc.read_text()
    monkeypatch.setattr(sys, "argv", argv)
    results_tables.main()
    text = doc.read_text()
    assert "| train | 20 | 3.00 | 50 | 3.00 | 2.50× |" in text and "stale table" not in text
    assert text.endswith("<!-- /table:scale -->\n\nafter\n")
    monkeypatch.setattr(sys, "argv", [*argv, "--check"])
    results_tables.main()  # the same now: exits normally
    doc.write_text("# Results, no block\n")
    with pytest.raises(SystemExit, match=r"no <!-- table:scale --> block in results\.md"):
        results_tables.main()


def test_pruning_keeps_what_the_tables_read_and_refuses_an_unfinished_run(tmp_path):
    fabricate(tmp_path)
    before = ws.collect(tmp_path)
    work = ws.work_dir(tmp_path, "current", 300, 0)
    (work / "results" / "sim" / "integrated").mkdir()
    (work / "results" / "sim" / "integrated" / "combat.h5ad").write_bytes(b"x" * 1000)
    (work / "results" / "sim" / "normalized.parquet").write_bytes(b"x" * 500)
    assert ws.prune(work) == pytest.approx(1.5e-6)
    assert not list((work / "results").rglob("*.h5ad"))
    assert not list((work / "results").rglob("*.parquet"))
    after = ws.collect(tmp_path)
    pd.testing.assert_frame_equal(before[0], after[0])
    pd.testing.assert_frame_equal(before[1], after[1])
    unfinished = ws.work_dir(tmp_path, "current", 300, 5)
    (unfinished / "results").mkdir(parents=True)
    with pytest.raises(ValueError, match=r"no run\.json"):
        ws.prune(unfinished)
