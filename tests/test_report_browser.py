"""Open a rendered report in headless Chromium: it loads, no JS error, every image shows;
at a 1024-pixel window the deciding columns stay in view, and printed on A4 they are there.

Needs Debian's ``/usr/bin/chromium`` (``apt-get install -y chromium``; ``.ci/run`` installs
it); skipped without it. The printed check also needs poppler-utils (``pdftotext``; skipped
without it). Screenshots, the PDF and its metrics page as an image are kept in
``test-artifacts/`` at the repository root.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from browser import (
    ARTIFACTS,
    CATCH,
    CHROMIUM,
    PDF_SKIP_REASON,
    PDFTOTEXT,
    PROBE,
    SKIP_REASON,
    chromium,
    pdf_page_image,
    pdf_pages,
    print_pdf,
    probe,
    screenshot,
)

from locusformer.baselines.methods import failed_result
from locusformer.io.results import make_result, write_result
from locusformer.report import render as report
from locusformer.scoring import metrics, tables

pytestmark = pytest.mark.skipif(not CHROMIUM.exists(), reason=SKIP_REASON)


def small_report(d: Path) -> Path:
    """A report on small synthetic data with every section filled (one method failed)."""
    rng = np.random.default_rng(0)
    n, genes = 48, 30
    batch = np.repeat(["b1", "b2"], n // 2)
    label = np.tile(["<b>T</b>", "B"], n // 2)
    obs = pd.DataFrame(
        {"batch": batch, "cell_type": label},
        index=pd.Index([f"s{i}" for i in range(n)], name="sample_id"),
    )
    x = rng.normal(5, 1, (n, genes)) + (batch == "b2")[:, None] + (label == "B")[:, None] * 2
    var = [f"G{i}" for i in range(genes)]
    integrated = {
        "uncorrected": make_result(
            x,
            method="uncorrected",
            representation="matrix",
            obs=obs,
            var_names=var,
            batch_key="batch",
            label_key="cell_type",
        ),
        "locusformer": make_result(
            x,
            method="locusformer",
            representation="embedding",
            obs=obs,
            var_names=var,
            embedding=rng.normal(size=(n, 8)),
            batch_key="batch",
            label_key="cell_type",
        ),
        "combat": failed_result(
            "combat",
            obs,
            var,
            RuntimeError("ComBat <needs> 2 samples"),
            batch_key="batch",
            label_key="cell_type",
        ),
    }
    paths = {}
    for method, res in integrated.items():
        paths[method] = d / "integrated" / f"{method}.h5ad"
        write_result(res, paths[method])

    names = metrics.metric_names(with_labels=True)
    # As on the tiny run: LocusFormer wins on Total by its batch score while keeping less
    # biology than the uncorrected data (bio 0.23 against 0.55), which the report flags.
    aggregates = {
        "uncorrected": {"Batch correction": 0.30, "Bio conservation": 0.55, "Total": 0.45},
        "locusformer": {"Batch correction": 0.85, "Bio conservation": 0.23, "Total": 0.478},
    }
    rows = []
    for method, base in (("uncorrected", 0.4), ("locusformer", 0.7)):
        for i, (metric, kind) in enumerate(names):
            value = aggregates[method].get(metric, base + 0.01 * i)
            rows.append([method, metric, kind, value, "ok", ""])
    table = pd.concat(
        [
            pd.DataFrame(rows, columns=tables.COLUMNS),
            metrics.failed_rows("combat", "ComBat <needs> 2 samples", True),
        ]
    )
    table.to_csv(d / "metrics.tsv", sep="\t", index=False)

    (d / "stats.json").write_text(
        json.dumps(
            {
                "n_samples": n,
                "n_genes_input": 40,
                "n_genes_kept": genes,
                "samples_per_batch": {"b1": n // 2, "b2": n // 2},
                "samples_per_label": {"<b>T</b>": n // 2, "B": n // 2},
                "genes_dropped": {"not_expressed": 4, "not_highly_variable": 6},
                "value_type": "log_expression",
            }
        )
    )
    chrom = ["1"] * 15 + ["2"] * 10 + [""] * 5
    pd.DataFrame(
        {
            "gene_id": var,
            "chrom": chrom,
            "start": range(genes),
            "end": range(genes),
            "position": range(genes),
            "placed": [c != "" for c in chrom],
            # the annotation's symbols, where it has them (none for the last five)
            "symbol": [f"SYM{i}" for i in range(genes - 5)] + [""] * 5,
        }
    ).to_parquet(d / "loci.parquet")
    pd.DataFrame(
        {
            "epoch": [1, 2, 3],
            "train_recon": [1.0, 0.5, 0.3],
            "train_cluster": [0.0, 0.0, 0.0],  # a term that never acted: not drawn
            "val_recon": [1.1, 0.6, 0.4],
            "disc_acc": [0.9, 0.7, 0.6],
            "lr": [1e-3, 5e-4, 2e-4],
        }
    ).to_csv(d / "history.tsv", sep="\t", index=False)
    att = rng.random((1, 2, 6, 6))
    np.savez(
        d / "attention.npz",
        attention=att / att.sum(-1, keepdims=True),
        token_chrom=np.array(["1", "1", "1", "2", "2", "X"]),
        token_genes=np.array([[f"G{2 * t}", f"G{2 * t + 1}"] for t in range(6)]),
        model_config=np.array(json.dumps({"d_model": 16, "n_heads": 2, "n_layers": 1})),
    )
    bench = d / "train.bench"
    bench.write_text(
        "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load"
        "\tcpu_time\n3.2\t0:00:03\t210.5\t500\t200\t205\t0\t1\t90\t2.9\n"
    )
    out = d / "report.html"
    report.render_dataset_report(
        out,
        dataset="browser <check>",
        metrics_tsv=d / "metrics.tsv",
        stats_json=d / "stats.json",
        loci_parquet=d / "loci.parquet",
        history_tsv=d / "history.tsv",
        integrated=paths,
        attention_npz=d / "attention.npz",
        benchmark_files={"train_locusformer": bench},
        config={"seed": 1},
        seed=1,
        batch_key="batch",
        label_key="cell_type",
    )
    return out


def test_report_opens_in_headless_chromium(tmp_path: Path) -> None:
    html_path = small_report(tmp_path)
    html = html_path.read_text(encoding="utf-8")
    assert "<script" not in html.lower()  # the report itself carries no JavaScript
    n_img = html.count("<img ")
    # loci, training, the embeddings' legend, 2 embeddings (combat failed), scatter,
    # attention, runtime
    assert n_img == 8

    result = probe(html_path, tmp_path)
    assert result["loaded"] is True
    assert result["errors"] == []
    assert result["images"] == n_img
    assert result["broken"] == []
    assert result["shown"] == n_img
    # the attention's flow diagram, under a <details> the probe opens
    assert result["svgs"] == 1 and result["svgs_shown"] == 1
    assert all(r.startswith("data:") for r in result["resources"]), result["resources"]
    assert result["title"] == "LocusFormer report: browser <check>"
    assert "Uncaught" not in result["stderr"]

    shot = ARTIFACTS / "report_browser.png"
    screenshot(html_path, shot, tmp_path)
    assert shot.stat().st_size > 20_000  # a rendered page, not a blank one
    shutil.copyfile(html_path, ARTIFACTS / "report_browser.html")


def test_at_1024_pixels_the_deciding_columns_stay_in_view(tmp_path: Path) -> None:
    """The Total, Batch correction and Bio conservation headers lie inside a 1024-pixel
    window; the wide per-metric columns scroll in their own box, not the page."""
    html_path = small_report(tmp_path)
    layout = probe(html_path, tmp_path, width=1024)["layout"]
    assert layout["viewport"] == 1024
    headers = dict((name, box) for name, box in layout["headers"])
    assert list(headers)[2:5] == ["Batch correction", "Bio conservation", "Total"]
    for name in ("Batch correction", "Bio conservation", "Total"):
        box = headers[name]
        assert box["width"] > 0 and 0 <= box["left"] and box["right"] <= 1024, (name, box)
    assert layout["page_width"] <= 1024  # nothing makes the page itself scroll sideways
    assert layout["table_box"]["right"] <= 1024
    # developer detail starts collapsed
    assert {"attention-diagram", "config-details", "versions-details"} <= set(
        layout["closed_details"]
    )

    shot = ARTIFACTS / "report_browser_1024.png"
    screenshot(html_path, shot, tmp_path, width=1024, height=min(16000, layout["page_height"]))
    assert shot.stat().st_size > 20_000


@pytest.mark.skipif(PDFTOTEXT is None, reason=PDF_SKIP_REASON)
def test_the_printed_report_keeps_the_total_column(tmp_path: Path) -> None:
    """Printed to PDF (A4, the print styles), the metrics table's header row, Total
    included, lies on the page (text outside the page's box does not count)."""
    html_path = small_report(tmp_path)
    pdf = ARTIFACTS / "report_browser.pdf"
    print_pdf(html_path, pdf, tmp_path)
    pages = pdf_pages(pdf)
    header = re.compile(r"rank\s+method\s+Batch correction\s+Bio conservation\s+Total\b")
    on = [i for i, text in enumerate(pages) if header.search(text)]
    assert len(on) == 1, [p[:400] for p in pages]
    page = pages[on[0]]
    # the ranked rows are on that page too, with the flagged one's warning
    assert re.search(r"\b1\s+locusformer\s+0\.850\s+0\.230\s+0\.478\b", page), page
    assert "Bio conservation below the uncorrected" in page
    image = pdf_page_image(pdf, on[0] + 1, ARTIFACTS / "report_browser_print_metrics")
    assert image.read_bytes().startswith(b"\x89PNG")


def test_the_probe_catches_broken_pages(tmp_path: Path) -> None:
    """Negative control: the same probe reports JS errors and images that do not show."""
    good = (
        "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk"
        "+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
    )
    page = tmp_path / "broken.html"
    page.write_text(
        "<!DOCTYPE html><html><head><title>t</title>" + CATCH + "</head><body>"
        f'<img alt="good" src="{good}">'
        '<img alt="corrupt" src="data:image/png;base64,AAAA">'
        '<img alt="remote" src="https://example.invalid/x.png">'
        "<script>undefinedFunction();</script>" + PROBE + "</body></html>",
        encoding="utf-8",
    )
    run = chromium(
        ["--virtual-time-budget=10000", "--dump-dom", page.as_uri()], tmp_path / "profile"
    )
    match = re.search(r'<pre id="probe-result">(.*?)</pre>', run.stdout, re.S)
    assert match, run.stderr[-2000:]
    result = json.loads(match.group(1).replace("&quot;", '"').replace("&amp;", "&"))
    assert result["images"] == 3
    assert sorted(result["broken"]) == ["corrupt", "remote"]
    assert any("undefinedFunction" in e for e in result["errors"])
    assert any(e.startswith("resource:") for e in result["errors"])
