"""The report's "Attention, step by step": rendered from the JSON of locusformer inspect."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from locusformer.cli.main import main
from locusformer.errors import InputError
from locusformer.infer.trace import trace
from locusformer.io.parquet import write_matrix_parquet
from locusformer.model.config import ModelConfig
from locusformer.model.files import ModelRecord, TrainedModel, save_model
from locusformer.model.layout import build_layout
from locusformer.model.network import LocusFormer
from locusformer.report import render as report
from locusformer.simulate.datasets import simulate

CONFIG = ModelConfig(
    patch_size=4, d_model=16, n_heads=2, n_layers=2, latent_dim=4, decoder_hidden=16,
    discriminator_hidden=8,
)  # fmt: skip


def make_model() -> tuple[TrainedModel, np.ndarray]:
    """An untrained two-layer model on simulated loci, and its samples' values."""
    sim = simulate(n_samples=10, n_loci=40, seed=1)
    torch.manual_seed(0)
    net = LocusFormer(CONFIG, build_layout(sim.loci, CONFIG.patch_size), 2).eval()
    net.set_standardization(sim.X.mean(0), sim.X.std(0))
    record = ModelRecord(["b0", "b1"], gene_ids=sim.loci["gene_id"].tolist(), loci=sim.loci)
    return TrainedModel(net, record), sim.X.astype(np.float32)


def assert_self_contained(html: str) -> None:
    """Nothing to fetch: the section adds tables and text only (tests/test_report.py checks
    the report's figures and styles in full)."""
    assert not re.search(r"<(script|link|iframe|object|embed|base)\b", html)
    assert "http://" not in html and "https://" not in html


def _section(html: str) -> str:
    start = html.index('<section id="trace">')
    return html[start : html.index("</section>", start)]


def _cells(table: str, label: str) -> list[str]:
    """The cells after the label and shape of the row named ``label`` in ``table``."""
    row = re.search(rf"<tr><td class=\"name\">{re.escape(label)}</td>(.*?)</tr>", table, re.S)
    assert row, label
    return re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)[1:]


@pytest.fixture(scope="module")
def traced(tmp_path_factory) -> dict:
    """A tiny model's trace written by the CLI, the way the workflow's inspect rule does."""
    torch.set_num_threads(1)
    d = tmp_path_factory.mktemp("trace")
    model, X = make_model()
    save_model(model, d / "model" / "model.pt", d / "model" / "model.json")
    ids = pd.Index([f"c{i}" for i in range(len(X))], name="sample_id")
    write_matrix_parquet(d / "ordered.parquet", X, ids, model.gene_ids)
    args = ["inspect", "--model", str(d / "model"), "--matrix", str(d / "ordered.parquet")]
    args += ["--n-samples", "4", "--seed", "3", "--device", "cpu", "--json"]
    assert main([*args, "--out", str(d / "inspect.json"), "--out-text", str(d / "t.txt")]) == 0
    return {
        "dir": d,
        "json": d / "inspect.json",
        "result": json.loads((d / "inspect.json").read_text()),
    }


def test_the_report_shows_each_layers_steps_per_head(traced, tmp_path: Path) -> None:
    html = report.render_dataset_report(tmp_path / "r.html", dataset="d", trace_json=traced["json"])
    assert_self_contained(html)
    assert '<a href="#trace">Attention, step by step</a>' in html
    section = _section(html)
    result = traced["result"]
    fp32 = result["runs"][0]
    assert ", ".join(result["samples"]) in section and "drawn with seed 3" in section
    verdict = re.search(r'<p id="trace-verdict">(.*?)</p>', section).group(1)
    assert verdict.startswith("No non-finite value in float32 or bfloat16; the naive softmax")
    assert "would stay finite too" in verdict
    # the verdict in view, the per-head tables under a collapsed <details> after it
    details = section.index('<details id="trace-details">')
    assert section.index('id="trace-verdict"') < details < section.index('class="trace"')
    H, T = CONFIG.n_heads, result["model"]["n_tokens"]
    tables = re.findall(r'<table class="trace" id="trace-layer-(\d+)">(.*?)</table>', section, re.S)
    assert [int(n) for n, _ in tables] == list(range(CONFIG.n_layers))
    for layer, table in tables:
        steps = {(s["head"], s["step"]): s for s in fp32["steps"] if s["layer"] == int(layer)}
        assert table.count("<th>head ") == H
        q = _cells(table, "Q")
        assert q == [
            f"{steps[(h, 'q')]['min']:.4g} … {steps[(h, 'q')]['max']:.4g}" for h in range(H)
        ]
        for h, cell in enumerate(_cells(table, "entropy of a row (nats)")):
            low, high = (float(v) for v in cell.split(" … "))
            assert 0 <= low <= high <= np.log(T) + 1e-3
            assert high == pytest.approx(steps[(h, "weights")]["entropy"]["max"], rel=1e-3)
        for cell in _cells(table, "max |row sum − 1|"):  # float32 / bfloat16
            ours, theirs = (float(v) for v in cell.split(" / "))
            assert ours < 1e-5 and theirs < 2.0**-7
        assert _cells(table, "non-finite values") == ["0 / 0"] * H
        assert _cells(table, "naive softmax (no row max)") == ["finite"] * H
        assert len(_cells(table, "block output (+ MLP)")) == 1  # one cell over the heads
    weights = result["difference"]["weights"]
    where = f"layer {weights['layer']} head {weights['head']} weights"
    assert f"{weights['max_abs']:.4f} at {where}" in section
    sums = re.search(r"max \|sum − 1\|</th><td[^>]*>(.*?)</td>", section).group(1)
    assert "in float32 (ok)" in sums and "in bfloat16 (ok)" in sums
    assert "nats, mean" in section and 'class="nonfinite"' not in section
    # the text form of the same trace came with it
    assert "largest difference float32 vs bfloat16" in (traced["dir"] / "t.txt").read_text()


def _report_cli(tmp_path: Path, *extra: str) -> str:
    """``locusformer report`` with an empty metrics table and ``extra``; its HTML."""
    from locusformer.scoring.tables import COLUMNS

    (tmp_path / "metrics.tsv").write_text("\t".join(COLUMNS) + "\n")
    out = tmp_path / "cli.html"
    args = ["report", "--dataset", "d", "--metrics", str(tmp_path / "metrics.tsv")]
    assert main([*args, "--batch-key", "b", *extra, "--out", str(out)]) == 0
    return out.read_text(encoding="utf-8")


def test_without_a_trace_the_report_has_no_such_section(tmp_path: Path) -> None:
    html = report.render_dataset_report(tmp_path / "r.html", dataset="d")
    assert 'id="trace"' not in html and "step by step" not in html
    assert "No attention maps available" in html  # the attention maps' section is still there
    assert 'id="trace"' not in _report_cli(tmp_path)  # as old callers of the CLI get it


def test_the_report_cli_takes_the_trace(traced, tmp_path: Path) -> None:
    html = _report_cli(tmp_path, "--trace", str(traced["json"]))
    assert 'id="trace-layer-1"' in _section(html)


def _write(result: dict, path: Path) -> Path:
    path.write_text(json.dumps(result))
    return path


def test_the_verdict_names_the_first_non_finite_step(tmp_path: Path, one_thread) -> None:
    model, X = make_model()
    D, K = CONFIG.d_model, CONFIG.d_model // CONFIG.n_heads
    with torch.no_grad():  # the K bias of layer 1, head 1
        model.module.encoder.blocks[1].attn.in_proj.bias[D + K] = float("nan")
    path = _write(trace(model, X[:2]), tmp_path / "nan.json")
    section = _section(
        report.render_dataset_report(tmp_path / "r.html", dataset="d", trace_json=path)
    )
    verdict = re.search(r'<p id="trace-verdict" class="warning">(.*?)</p>', section).group(1)
    assert verdict == "First non-finite value at layer 1 head 1, step k, in float32 and bfloat16."
    table = re.search(r'id="trace-layer-1">(.*?)</table>', section, re.S).group(1)
    assert re.search(r'<td class="nonfinite">[^<]*nan, 0 inf in float32', table)
    head0, head1 = _cells(table, "non-finite values")
    assert head0 == "0 / 0" and head1 != "0 / 0"
    layer0 = re.search(r'id="trace-layer-0">(.*?)</table>', section, re.S).group(1)
    assert 'class="nonfinite"' not in layer0  # the steps before are finite


def test_the_verdict_says_where_the_naive_softmax_would_overflow(
    tmp_path: Path, one_thread
) -> None:
    model, X = make_model()
    D = CONFIG.d_model
    with torch.no_grad():  # W_Q and W_K of layer 0 scaled up: logits of thousands
        model.module.encoder.blocks[0].attn.in_proj.weight[: 2 * D] *= 60.0
    result = trace(model, X[:3], dtypes=("float32",))
    first = result["runs"][0]["naive_first_nonfinite"]
    path = _write(result, tmp_path / "over.json")
    section = _section(
        report.render_dataset_report(tmp_path / "r.html", dataset="d", trace_json=path)
    )
    verdict = re.search(r'<p id="trace-verdict" class="note">(.*?)</p>', section).group(1)
    assert verdict == (
        "No non-finite value in float32; the naive softmax (without the row maximum subtracted)"
        f" would overflow first at layer 0 head {first['head']} (exp of the scaled scores, in"
        " float32)."
    )
    table = re.search(r'id="trace-layer-0">(.*?)</table>', section, re.S).group(1)
    assert "overflows in float32" in _cells(table, "naive softmax (no row max)")
    assert "bfloat16" not in section  # one dtype traced: no difference rows


def test_a_mapped_dataset_says_its_trace_is_its_models(tmp_path: Path) -> None:
    mapping = {
        "model": {"name": "atlas", "weights": "results/atlas/model/model.pt"},
        "genes": {"n_model_loci": 40, "n_present": 40, "n_missing": 0},
        "trained_batches": ["b0", "b1"],
        "new_batches": [],
        "adapted": False,
    }
    path = _write(mapping, tmp_path / "mapping.json")
    html = report.render_dataset_report(tmp_path / "r.html", dataset="q", mapping_json=path)
    section = _section(html)
    assert "Not traced" in section and "<code>atlas</code>" in section
    assert "trace-layer" not in section and '<a href="#trace">' in html


def test_a_file_that_is_no_trace_is_refused_in_one_line(traced, tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputError, match="cannot read the trace") as error:
        report.render_dataset_report(
            tmp_path / "r.html", dataset="d", trace_json=tmp_path / "bad.json"
        )
    assert "\n" not in str(error.value)
    broken = dict(traced["result"])
    broken["runs"] = [{**run, "steps": run["steps"][:5]} for run in broken["runs"]]
    with pytest.raises(InputError, match="not a trace of locusformer inspect --json"):
        report.render_dataset_report(
            tmp_path / "r.html", dataset="d", trace_json=_write(broken, tmp_path / "short.json")
        )
    assert not (tmp_path / "r.html").exists()
