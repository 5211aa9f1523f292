"""The report at a glance: the verdict's margin and seeds, the bio-loss warning, the loss
terms drawn, the genes' symbols, the scatter and the layout that keeps the deciding columns.

No browser here (``test_report_browser.py`` opens the page); these check what the report
says and draws from made-up inputs.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from locusformer.report import figures, sections
from locusformer.report import render as report
from locusformer.report.attention import attention_section, top_patches
from locusformer.scoring import metrics, tables


def scores(**rows: tuple[float, float, float] | None) -> pd.DataFrame:
    """method -> (batch, bio, total), or None for a failed method."""
    return pd.DataFrame(
        [
            {
                "method": m,
                "batch": np.nan if v is None else v[0],
                "bio": np.nan if v is None else v[1],
                "total": np.nan if v is None else v[2],
                "status": "failed" if v is None else "ok",
            }
            for m, v in rows.items()
        ]
    )


def write_metrics(path: Path, **rows: tuple[float, float, float]) -> Path:
    """A metrics table: method -> (batch, bio, total) aggregates; the metrics made up."""
    out = []
    for method, (batch, bio, total) in rows.items():
        aggregates = {"Batch correction": batch, "Bio conservation": bio, "Total": total}
        for i, (name, kind) in enumerate(metrics.metric_names(True)):
            value = aggregates.get(name, 0.5 + 0.01 * i)
            out.append([method, name, kind, value, "ok", ""])
    pd.DataFrame(out, columns=tables.COLUMNS).to_csv(path, sep="\t", index=False)
    return path


# --------------------------------------------------------------------------- verdict


def test_the_verdict_gives_its_margin_over_the_runner_up() -> None:
    v = sections.verdict(
        scores(uncorrected=(0.3, 0.55, 0.45), harmony=(0.6, 0.6, 0.6), combat=(0.5, 0.58, 0.548))
    )
    assert v["sentence"] == "harmony scored best (total 0.600; uncorrected 0.450)."  # as before
    assert v["runner_up"] == "combat" and v["margin"] == pytest.approx(0.052)
    assert v["margin_sentence"] == (
        "Margin: harmony leads the runner-up, combat (total 0.548), by 0.052 in Total."
    )
    # the uncorrected data crowned: their lead over the best correction, not a worse one
    v = sections.verdict(
        scores(uncorrected=(0.3, 0.9, 0.7), combat=(0.5, 0.7, 0.65), harmony=(0.5, 0.6, 0.6))
    )
    assert v["crowned"] == "uncorrected" and v["runner_up"] == "combat"
    assert v["margin"] == pytest.approx(0.05)
    assert (
        "the uncorrected data lead the best correction, combat (total 0.650), by 0.050"
        in (v["margin_sentence"])
    )
    # the runner-up may be the uncorrected data; a failed method is never one
    v = sections.verdict(scores(uncorrected=(0.3, 0.5, 0.45), lf=(0.9, 0.2, 0.48), combat=None))
    assert v["runner_up"] == "uncorrected" and v["margin"] == pytest.approx(0.03)
    # no uncorrected data: the second correction
    v = sections.verdict(scores(combat=(0.5, 0.5, 0.5), harmony=(0.6, 0.6, 0.6)))
    assert v["runner_up"] == "combat" and v["margin"] == pytest.approx(0.1)
    # nothing to compare with: no margin, said nowhere
    alone = sections.verdict(scores(uncorrected=(0.3, 0.5, 0.45), combat=None))
    assert alone["runner_up"] is None and alone["margin"] is None
    assert alone["margin_sentence"] == ""


def test_the_seed_sentence_says_one_seed_or_the_spread() -> None:
    one = sections.seeds_sentence(3)
    assert one.startswith("These scores come from one seed (seed 3):")
    assert sections.seeds_sentence(None).startswith("These scores come from one seed:")
    spread = sections.seeds_sentence(3, {"harmony": [0.6, 0.62, 0.58], "combat": [0.55, 0.57]})
    assert spread == (
        "Over 3 seeds; this report shows seed 3, Total ranged: harmony 0.580 to 0.620; "
        "combat 0.550 to 0.570."
    )


def test_the_report_says_margin_and_seeds_at_the_top(tmp_path: Path) -> None:
    tsv = write_metrics(
        tmp_path / "m.tsv", uncorrected=(0.3, 0.55, 0.45), locusformer=(0.85, 0.23, 0.478)
    )
    html = report.render_dataset_report(tmp_path / "r.html", dataset="d", metrics_tsv=tsv, seed=5)
    top = html[: html.index("<nav>")]
    assert 'id="at-a-glance"' in top
    assert "locusformer scored best (total 0.478; uncorrected 0.450)." in top
    margin = re.search(r'<p id="verdict-margin">([^<]*)</p>', top)
    assert margin and margin.group(1) == (
        "Margin: locusformer leads the runner-up, uncorrected (total 0.450), by 0.028 in Total."
    )
    seeds = re.search(r'<p id="verdict-seeds">([^<]*)</p>', top)
    assert seeds and "one seed (seed 5)" in seeds.group(1)
    # other seeds' tables: the spread of the two leading methods, the table still this run's
    other = write_metrics(
        tmp_path / "m2.tsv", uncorrected=(0.3, 0.55, 0.452), locusformer=(0.8, 0.25, 0.47)
    )
    html = report.render_dataset_report(
        tmp_path / "r2.html", dataset="d", metrics_tsv=tsv, seed=5, seed_metrics=[other]
    )
    seeds = re.search(r'<p id="verdict-seeds">([^<]*)</p>', html)
    assert seeds and seeds.group(1) == (
        "Over 2 seeds; this report shows seed 5, Total ranged: locusformer 0.470 to 0.478; "
        "uncorrected 0.450 to 0.452."
    )
    table = html[html.index('<table id="metric-table">') :]
    assert "<td>0.470</td>" not in table[: table.index("</table>")]


# --------------------------------------------------------------------------- bio loss


def test_a_method_below_the_uncorrected_bio_score_is_flagged(tmp_path: Path) -> None:
    s = scores(
        uncorrected=(0.3, 0.55, 0.45),
        locusformer=(0.85, 0.23, 0.478),
        harmony=(0.6, 0.6, 0.6),
        combat=None,
    ).set_index("method")
    losses = sections.bio_losses(s, {"locusformer": "LocusFormer"})
    assert [b["method"] for b in losses] == ["locusformer"]
    assert losses[0]["sentence"].startswith(
        "LocusFormer kept less biology than no correction: bio conservation 0.230, below the "
        "uncorrected data's 0.550."
    )
    assert sections.bio_losses(s.drop("uncorrected")) == []  # nothing to fall below

    tsv = write_metrics(
        tmp_path / "m.tsv",
        uncorrected=(0.3, 0.55, 0.45),
        locusformer=(0.85, 0.23, 0.478),
        harmony=(0.6, 0.6, 0.6),
    )
    html = report.render_dataset_report(tmp_path / "r.html", dataset="d", metrics_tsv=tsv)
    top = html[: html.index("<nav>")]
    assert top.count('class="warning bio-loss-warning"') == 1
    assert "locusformer kept less biology than no correction" in top
    table = html[html.index('<table id="metric-table">') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr( class=\"[^\"]*\")?><td>(\d+|&#9888;|–)</td>", table)
    assert rows == [
        ("", "1"),
        (' class="bio-loss"', "2"),
        (' class="bio-loss-note"', "&#9888;"),
        ("", "3"),
    ]
    assert "Bio conservation below the uncorrected data&#39;s: biology lost." in table


# --------------------------------------------------------------------------- training


def test_loss_terms_zero_throughout_are_not_drawn(tmp_path: Path, monkeypatch) -> None:
    drawn: list = []
    real = sections.history_figure

    def spy(x, numeric, panels):
        drawn.extend(panels)
        return real(x, numeric, panels)

    monkeypatch.setattr(sections, "history_figure", spy)
    pd.DataFrame(
        {
            "epoch": [1, 2, 3],
            "train_recon": [1.0, 0.5, 0.3],
            "train_cluster": [0.0, 0.0, 0.0],
            "train_protect": [np.nan, 0.0, 0.0],  # not computed the first epoch, then zero
            "train_adversary": [0.0, 0.2, 0.1],  # zero at first, then acting: drawn
            "lr": [1e-3, 5e-4, 2e-4],
        }
    ).to_csv(tmp_path / "h.tsv", sep="\t", index=False)
    section = sections.history_section(tmp_path / "h.tsv")
    assert dict(drawn) == {"losses": ["train_recon", "train_adversary"], "learning rate": ["lr"]}
    assert section["silent"] == ["train_cluster", "train_protect"]
    assert "train_cluster" in section["columns"]  # still named among the columns
    html = report.render_dataset_report(
        tmp_path / "r.html", dataset="d", history_tsv=tmp_path / "h.tsv"
    )
    assert (
        '<span id="history-silent">Zero at every epoch, so not drawn: train_cluster, '
        "train_protect.</span>" in html
    )
    pd.DataFrame({"epoch": [1, 2], "train_recon": [0.0, 0.0]}).to_csv(
        tmp_path / "z.tsv", sep="\t", index=False
    )
    zero = sections.history_section(tmp_path / "z.tsv")
    assert not zero["available"] and "zero throughout" in zero["message"]


# --------------------------------------------------------------------------- symbols


def test_patches_are_named_by_symbol_where_the_annotation_has_one(tmp_path: Path) -> None:
    mean = np.full((2, 2), 0.5)
    mean[:, 0] = 0.7
    mean[:, 1] = 0.3
    genes = np.array([["ENSG1", "ENSG2"], ["ENSG3", ""]])
    rows = top_patches(mean, np.array(["1", "2"]), genes, symbols={"ENSG1": "TP53"})
    assert [r["genes"] for r in rows] == ["TP53, ENSG2", "ENSG3"]  # an id where no symbol

    att = np.stack([mean, mean])[None]  # (1 layer, 2 heads, 2, 2)
    np.savez(tmp_path / "a.npz", attention=att, token_chrom=np.array(["1", "2"]), token_genes=genes)
    loci = {"gene_id": ["ENSG1", "ENSG2", "ENSG3"], "chrom": ["1", "1", "2"]}
    pd.DataFrame({**loci, "symbol": ["TP53", None, "<MYC>"]}).to_parquet(tmp_path / "loci.parquet")
    section = attention_section(tmp_path / "a.npz", tmp_path / "loci.parquet")
    assert [r["genes"] for r in section["top"]] == ["TP53, ENSG2", "<MYC>"]
    assert section["gene_names"] == "symbols where known, else ids"
    html = report.render_dataset_report(
        tmp_path / "r.html",
        dataset="d",
        attention_npz=tmp_path / "a.npz",
        loci_parquet=tmp_path / "loci.parquet",
    )
    assert '<th class="name">genes (symbols where known, else ids)</th>' in html
    assert "&lt;MYC&gt;" in html and "<MYC>" not in html
    # no symbol column: the ids, said so
    pd.DataFrame(loci).to_parquet(tmp_path / "plain.parquet")
    plain = attention_section(tmp_path / "a.npz", tmp_path / "plain.parquet")
    assert [r["genes"] for r in plain["top"]] == ["ENSG1, ENSG2", "ENSG3"]
    assert plain["gene_names"] == "ids"
    # a map that carries its own symbols (token_symbols)
    symbols = np.array([["TP53", "MDM2"], ["MYC", ""]])
    np.savez(
        tmp_path / "s.npz",
        attention=att,
        token_chrom=np.array(["1", "2"]),
        token_genes=genes,
        token_symbols=symbols,
    )
    own = attention_section(tmp_path / "s.npz")
    assert [r["genes"] for r in own["top"]] == ["TP53, MDM2", "MYC"]
    assert own["gene_names"] == "symbols"


# --------------------------------------------------------------------------- figures


def test_the_scatter_gives_each_method_its_colour_and_fits_its_axes(monkeypatch) -> None:
    kept: list = []

    def keep(fig) -> str:
        kept.append(fig)
        return "data:image/png;base64,"

    monkeypatch.setattr(figures, "_png", keep)
    pts = pd.DataFrame(
        {"batch": [0.62, 0.64, 0.63, 0.70], "bio": [0.80, 0.81, 0.79, 0.75]},
        index=["harmony", "combat", "uncorrected", "scvi"],
    )
    figures.scores_figure(pts, {"scvi": "scVI <latent>"})
    ax = kept[0].axes[0]
    (x0, x1), (y0, y1) = ax.get_xlim(), ax.get_ylim()
    # fitted to the points with a margin, not 0 to 1
    assert 0.55 < x0 < 0.62 and 0.70 < x1 < 0.75 and 0.70 < y0 < 0.75 and 0.81 < y1 < 0.85
    colours = [tuple(np.round(c.get_facecolor()[0], 3)) for c in ax.collections]
    assert len(set(colours)) == 4  # one colour per method
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["harmony", "combat", "uncorrected", "scVI <latent>"]  # the table's order


# --------------------------------------------------------------------------- layout


def test_the_deciding_columns_come_first_and_detail_is_collapsed(tmp_path: Path) -> None:
    tsv = write_metrics(
        tmp_path / "m.tsv", uncorrected=(0.3, 0.55, 0.45), locusformer=(0.85, 0.6, 0.7)
    )
    html = report.render_dataset_report(
        tmp_path / "r.html", dataset="d", metrics_tsv=tsv, config={"seed": 1}, seed=1
    )
    table = html[html.index('<table id="metric-table">') :]
    headers = re.findall(r"<th[^>]*>([^<]*)</th>", table[: table.index("</tr>")])
    assert headers[:5] == ["rank", "method", "Batch correction", "Bio conservation", "Total"]
    assert sorted(headers[5:]) == sorted(
        n for n, k in metrics.metric_names(True) if k != "aggregate"
    )
    assert '<div class="table-scroll" id="metric-table-scroll">' in html
    # only the view changes: the section keeps the metrics table's order, and says its own
    section = sections.metrics_section(tsv)
    assert [c["name"] for c in section["columns"]] == [m for m, _ in metrics.metric_names(True)]
    shown = [section["columns"][i]["name"] for i in section["order"]]
    assert shown == headers[2:]
    first = re.search(r"<tr><td>1</td><td class=\"name\">locusformer</td>(.*?)</tr>", table, re.S)
    assert first and re.findall(r">([\d.]+)<", first.group(1))[:3] == ["0.850", "0.600", "0.700"]
    # developer detail is there but collapsed; print styles are inline
    assert '<details id="config-details">' in html and '<details id="versions-details">' in html
    assert "<details open" not in html
    assert "@media print" in html and "@page { size: A4" in html
    assert "seed: 1" in html[html.index('<details id="config-details">') :]


def test_the_metrics_say_which_representation_to_use_in_python(tmp_path: Path) -> None:
    tsv = write_metrics(
        tmp_path / "m.tsv", uncorrected=(0.3, 0.55, 0.45), locusformer=(0.85, 0.6, 0.7)
    )
    html = report.render_dataset_report(tmp_path / "r.html", dataset="d", metrics_tsv=tsv)
    said = re.search(r'<p class="muted" id="metrics-representations">(.*?)</p>', html, re.S)
    assert said and 'obsm["X_locusformer_pca"]' in said.group(1)
    assert "sc.pp.neighbors" in said.group(1)
