"""The report's attention section: the model's diagram, chromosome map, attended patches."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest
import torch

from locusformer.errors import InputError
from locusformer.model.config import ModelConfig
from locusformer.model.files import ModelRecord, TrainedModel
from locusformer.model.layout import build_layout
from locusformer.model.network import LocusFormer
from locusformer.report import render as report
from locusformer.report.attention import chromosome_attention, top_patches
from locusformer.simulate.datasets import simulate
from locusformer.steps.attention import write_attention

SVG = "{http://www.w3.org/2000/svg}"


def test_chromosome_attention_by_hand() -> None:
    chrom = np.array(["chr1", "chr1", "chr2", "chr2", "chr2"])
    mean = np.full((5, 5), 1 / 5)  # chr2's patches attend uniformly
    mean[:2] = [0, 0, 1 / 3, 1 / 3, 1 / 3]  # chr1's attend to chr2 only
    names, between = chromosome_attention(mean, chrom)
    assert names == ["chr1", "chr2"]
    np.testing.assert_allclose(between, [[0, 5 / 3], [1, 1]])


def test_top_patches_name_their_genes() -> None:
    mean = np.zeros((3, 3))
    mean[:, 2], mean[:, 0], mean[:, 1] = 0.7, 0.3, 0.0  # every query: token 2 most
    genes = np.array([["A", "B", ""], ["C", "D", "E"], [f"G{i}" for i in range(3)]])
    genes = np.concatenate([genes, np.full((3, 7), "")], axis=1)
    genes[2, 3:] = [f"G{i}" for i in range(3, 10)]
    rows = top_patches(mean, np.array(["1", "1", "2"]), genes, n=2)
    assert [r["token"] for r in rows] == [2, 0]
    assert rows[0]["received"] == pytest.approx(2.1) and rows[0]["chrom"] == "2"
    assert rows[0]["genes"] == "G0, G1, G2, G3, G4, G5, G6, G7 … 2 more"
    assert rows[0]["n_genes"] == 10
    assert rows[1]["genes"] == "A, B" and rows[1]["n_genes"] == 2  # padding "" left out


@pytest.fixture(scope="module")
def attention_npz(tmp_path_factory) -> tuple[Path, TrainedModel]:
    torch.set_num_threads(1)
    sim = simulate(n_samples=12, n_loci=60, n_chromosomes=3, seed=2)
    config = ModelConfig(
        patch_size=4, d_model=24, n_heads=3, n_layers=2, latent_dim=4, decoder_hidden=16,
        discriminator_hidden=8,
    )  # fmt: skip
    torch.manual_seed(0)
    net = LocusFormer(config, build_layout(sim.loci, config.patch_size), 2).eval()
    record = ModelRecord(["b0", "b1"], gene_ids=sim.loci["gene_id"].tolist(), loci=sim.loci)
    model = TrainedModel(net, record)
    path = tmp_path_factory.mktemp("att") / "attention.npz"
    write_attention(model, sim.X, [f"b{b}" for b in sim.batch], path)
    return path, model


def test_the_npz_holds_the_genes_of_each_patch_and_the_config(attention_npz) -> None:
    path, model = attention_npz
    with np.load(path, allow_pickle=False) as npz:
        genes, config = npz["token_genes"], json.loads(str(npz["model_config"]))
    index = model.module.embed.token_index.numpy()
    assert genes.shape == index.shape
    for token, slots in enumerate(index):
        real = [model.gene_ids[i] for i in slots if i < model.n_loci]
        assert [g for g in genes[token] if g] == real
    assert ModelConfig.from_dict(config) == model.config


def test_the_report_draws_the_models_diagram_and_its_attended_patches(
    attention_npz, tmp_path: Path
) -> None:
    path, model = attention_npz
    html = report.render_dataset_report(tmp_path / "r.html", dataset="d", attention_npz=path)
    svg = html[html.index("<svg") : html.index("</svg>") + len("</svg>")]
    root = ET.fromstring(svg)  # inline SVG that parses as XML
    T, K = model.n_tokens, 24 // 3
    shapes = {t.get("data-edge"): t.get("data-shape") for t in root.iter(f"{SVG}text")}
    assert shapes["weights"] == f"(B, 3, {T}, {T})" and shapes["v"] == f"(B, 3, {T}, {K})"
    assert root.get("data-layers") == "2"
    assert 'alt="Attention between chromosomes"' in html and html.count("<img ") == 1
    table = html[html.index('<table id="attended-patches">') :]
    table = table[: table.index("</table>")]
    rows = re.findall(r"<tr><td>(\d+)</td><td>(\d+)</td>", table)
    assert [int(rank) for rank, _ in rows] == list(range(1, 11))
    with np.load(path, allow_pickle=False) as npz:
        att, genes = npz["attention"], npz["token_genes"]
    received = att.mean(axis=(0, 1)).mean(axis=0)
    top = int(rows[0][1])
    assert received[top] == pytest.approx(received.max())
    assert next(g for g in genes[top] if g) in table


def test_a_config_that_does_not_fit_the_attention_is_refused(tmp_path: Path) -> None:
    config = json.dumps(ModelConfig(n_heads=2, n_layers=1).to_dict())
    np.savez(
        tmp_path / "a.npz",
        attention=np.full((1, 4, 3, 3), 1 / 3),
        token_chrom=np.array(["1", "1", "2"]),
        model_config=np.array(config),
    )
    with pytest.raises(InputError, match="1 layers x 4 heads, its model_config 1 x 2"):
        report.render_dataset_report(
            tmp_path / "r.html", dataset="x", attention_npz=tmp_path / "a.npz"
        )
    assert not (tmp_path / "r.html").exists()
