"""HTML reports: content, escaping of user-provided names, self-containedness."""

from __future__ import annotations

import base64
import json
from html.parser import HTMLParser
from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
import pytest

from locusformer.errors import InputError
from locusformer.report import render as report
from locusformer.scoring import metrics, tables
from locusformer.steps import metrics as steps_metrics
from locusformer.steps.aggregate import aggregate_metrics
from locusformer.steps.baseline import run_baseline
from locusformer.steps.summarize import summarize

EVIL_DATASET = "<script>alert('dataset')</script>"
EVIL_BATCH = "<script>alert('batch')</script>"
EVIL_LABEL = "<img src=x onerror=alert('label')>"


class Tags(HTMLParser):
    """Every start tag with its attributes, and the text of <style> blocks."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.styles: list[str] = []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.styles.append(data)


def parse(html: str) -> Tags:
    p = Tags()
    p.feed(html)
    return p


def assert_self_contained(html: str) -> list[str]:
    """No external resource of any kind; returns the <img> sources (all PNG data URIs)."""
    p = parse(html)
    names = {t for t, _ in p.tags}
    assert not names & {"script", "link", "iframe", "object", "embed", "base"}, names
    for tag, attrs in p.tags:
        for key in ("src", "href", "srcset", "poster", "data", "action"):
            value = attrs.get(key)
            if value is None:
                continue
            assert not value.lower().startswith(("http:", "https:", "//", "ftp:")), (tag, value)
            if key == "src":
                assert value.startswith("data:image/png;base64,"), (tag, value[:40])
    for css in p.styles:
        assert "url(" not in css and "@import" not in css
    assert "http://" not in html and "https://" not in html
    images = [a["src"] for t, a in p.tags if t == "img"]
    for src in images:
        png = base64.b64decode(src.split(",", 1)[1], validate=True)
        assert png.startswith(b"\x89PNG\r\n\x1a\n")
    return images


def synthetic(n_per: int = 20, genes: int = 60, seed: int = 0) -> ad.AnnData:
    rng = np.random.default_rng(seed)
    groups = ["t0", "t1", EVIL_LABEL]
    centers = rng.normal(0, 2, (len(groups), genes))
    shifts = rng.normal(0, 0.7, (2, genes))
    x, rows = [], []
    for b in range(2):
        for g, label in enumerate(groups):
            for k in range(n_per):
                x.append(5 + centers[g] + shifts[b] + rng.normal(0, 1, genes))
                rows.append((f"s{b}_{g}_{k}", f"b{b}", label))
    # one more batch with a single sample: ComBat cannot fit it and fails
    x.append(5 + centers[0] + rng.normal(0, 1, genes))
    rows.append(("lonely", EVIL_BATCH, "t0"))
    obs = pd.DataFrame(rows, columns=["sample_id", "batch", "cell_type"]).set_index("sample_id")
    adata = ad.AnnData(np.asarray(x, dtype=np.float32), obs=obs)
    adata.var_names = [f"G{i:03d}" for i in range(genes)]
    return adata


def write_bench(path: Path, seconds: float, rss: float) -> Path:
    path.write_text(
        "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
        f"{seconds}\t0:00:{int(seconds):02d}\t{rss}\t900.1\t400.2\t410.3\t0.1\t2.5\t88.0\t"
        f"{seconds * 0.9}\n"
    )
    return path


def build_dataset(d: Path, adata: ad.AnnData, label_key: str | None = "cell_type") -> dict:
    """All inputs of a dataset report, the way the workflow writes them."""
    d.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(
        adata.X, index=pd.Index(adata.obs_names, name="sample_id"), columns=adata.var_names
    )
    frame.to_parquet(d / "ordered.parquet")
    adata.obs.rename_axis("sample_id").reset_index().to_csv(
        d / "samples.tsv", sep="\t", index=False
    )
    integrated = {}
    for method in ("uncorrected", "combat", "harmony"):
        integrated[method] = d / "integrated" / f"{method}.h5ad"
        run_baseline(
            method,
            d / "ordered.parquet",
            d / "samples.tsv",
            "batch",
            label_key,
            integrated[method],
            seed=0,
        )
    stats = {
        "n_samples": adata.n_obs,
        "n_genes_input": adata.n_vars + 25,
        "n_genes_kept": adata.n_vars,
        "samples_per_batch": adata.obs["batch"].astype(str).value_counts().to_dict(),
        "samples_per_label": adata.obs["cell_type"].astype(str).value_counts().to_dict(),
        "genes_dropped": {"not_expressed": 10, "not_highly_variable": 15},
        "value_type": "log_expression",
    }
    (d / "stats.json").write_text(json.dumps(stats))
    n = adata.n_vars
    chrom = ["1"] * (n // 2) + ["2"] * (n // 4) + ["X"] * (n - n // 2 - n // 4 - 5) + [""] * 5
    pd.DataFrame(
        {
            "gene_id": adata.var_names,
            "chrom": chrom,
            "start": np.arange(n) * 100,
            "end": np.arange(n) * 100 + 50,
            "position": np.arange(n),
            "placed": [c != "" for c in chrom],
        }
    ).to_parquet(d / "loci.parquet")
    epochs = np.arange(1, 11)
    pd.DataFrame(
        {
            "epoch": epochs,
            "train_recon": 1 / epochs,
            "val_recon": 1.2 / epochs,
            "adversary": 0.69 - epochs / 100,
            "total": 1 / epochs + 0.1,
            "disc_acc": 0.9 - epochs / 50,
            "lr": 1e-3 * 0.8**epochs,
        }
    ).to_csv(d / "history.tsv", sep="\t", index=False)
    rng = np.random.default_rng(0)
    att = rng.random((2, 3, 12, 12))
    att /= att.sum(axis=-1, keepdims=True)
    tokens = np.array(["1"] * 6 + ["2"] * 4 + ["X"] * 2)
    np.savez(d / "attention.npz", attention=att, token_chrom=tokens)
    bench = {
        "normalize": write_bench(d / "normalize.bench", 2.0, 300.0),
        "baseline_combat": write_bench(d / "combat.bench", 3.0, 400.0),
        "train_locusformer": write_bench(d / "train.bench", 40.0, 1500.0),
    }
    return {"integrated": integrated, "bench": bench, "dir": d}


@pytest.fixture(scope="module")
def dataset(tmp_path_factory) -> dict:
    d = tmp_path_factory.mktemp("ds")
    built = build_dataset(d, synthetic())
    tsvs = []
    for method, path in built["integrated"].items():
        out = d / "metrics" / f"{method}.tsv"
        steps_metrics.run_metrics(
            path, built["integrated"]["uncorrected"], "batch", "cell_type", out, method
        )
        tsvs.append(out)
    aggregate_metrics(tsvs, d / "metrics.tsv")
    html = report.render_dataset_report(
        d / "report.html",
        dataset=EVIL_DATASET,
        metrics_tsv=d / "metrics.tsv",
        stats_json=d / "stats.json",
        loci_parquet=d / "loci.parquet",
        history_tsv=d / "history.tsv",
        integrated=built["integrated"],
        attention_npz=d / "attention.npz",
        benchmark_files=built["bench"],
        config={"seed": 7, "datasets": {EVIL_DATASET: {"batch": "batch"}}},
        seed=7,
        batch_key="batch",
        label_key="cell_type",
    )
    return {**built, "html": html}


def test_report_is_written_and_returned(dataset) -> None:
    on_disk = (dataset["dir"] / "report.html").read_text(encoding="utf-8")
    assert on_disk == dataset["html"]
    assert on_disk.startswith("<!DOCTYPE html>")


def test_report_escapes_user_provided_names(dataset) -> None:
    html = dataset["html"]
    assert "<script" not in html.lower()
    assert "<img src=x" not in html
    assert "&lt;script&gt;alert(&#39;dataset&#39;)&lt;/script&gt;" in html
    assert "&lt;script&gt;alert(&#39;batch&#39;)&lt;/script&gt;" in html  # sample tables
    assert "&lt;img src=x onerror=alert(&#39;label&#39;)&gt;" in html
    # the failed ComBat's error names the batch: escaped as well
    error = [line for line in html.splitlines() if "at least 2 samples per batch" in line]
    assert error and all("&lt;script&gt;" in line for line in error)


def test_report_is_self_contained(dataset) -> None:
    images = assert_self_contained(dataset["html"])
    # loci, training, the embeddings' shared legend, 2 embeddings (combat failed), scatter,
    # attention, runtime
    assert len(images) == 8
    assert len(dataset["html"].encode()) < 5_000_000


def test_report_content(dataset) -> None:
    html = dataset["html"]
    p = parse(html)
    ids = {a.get("id") for _, a in p.tags}
    for section in (
        "summary",
        "loci",
        "training",
        "embeddings",
        "metrics",
        "attention",
        "runtime",
        "provenance",
    ):
        assert section in ids
    alts = [a.get("alt") for t, a in p.tags if t == "img"]
    assert "PCA of uncorrected" in alts and "PCA of harmony" in alts
    assert "Attention between chromosomes" in alts and "Training curves" in alts
    # embeddings: uncorrected first
    assert html.index("<h3>uncorrected</h3>") < html.index("<h3>harmony</h3>")
    assert "Failed:" in html and "ComBat needs at least 2 samples per batch" in html
    assert "55 of 60 loci placed" in html
    assert "train_recon" in html and "disc_acc" in html
    assert "train_locusformer" in html and "1500.0" in html
    assert "scib-metrics" in html and "harmonypy" in html and "numpy" in html
    assert "seed: 7" in html


def test_metric_table_ranks_methods_and_marks_the_best(dataset) -> None:
    html = dataset["html"]
    table = html[html.index('<table id="metric-table">') :]
    table = table[: table.index("</table>")]
    long = tables.read_metrics(dataset["dir"] / "metrics.tsv")
    totals = long[long["metric"] == "Total"].set_index("method")["value"]
    ranked = totals.drop("combat").sort_values(ascending=False).index.tolist()
    positions = [table.index(f'<td class="name">{m}</td>') for m in [*ranked, "combat"]]
    assert positions == sorted(positions)  # ranked by total, the failed method last
    assert 'class="failed"' in table and "failed: RuntimeError" in table
    wide = tables.wide_metrics(long).drop("combat")
    n_best = sum(int((wide[c] >= wide[c].max() - 1e-12).sum()) for c in wide.columns)
    assert table.count('class="best"') == n_best
    best_total = f"{totals.drop('combat').max():.3f}"
    assert f'<td class="best">{best_total}</td>' in table


def test_the_metrics_section_says_how_many_kmeans_starts_were_scored(dataset, tmp_path) -> None:
    assert 'id="metrics-kmeans"' not in dataset["html"]  # the config does not say
    for starts, said in ((1, "one k-means start"), (10, "clustering of 10 k-means starts")):
        html = report.render_dataset_report(
            tmp_path / f"r{starts}.html",
            dataset="d",
            metrics_tsv=dataset["dir"] / "metrics.tsv",
            config={"metrics": {"kmeans_starts": starts}},
        )
        sentence = html[html.index('<p id="metrics-kmeans">') :]
        sentence = sentence[: sentence.index("</p>")]
        assert (
            said in sentence and f"metrics.kmeans_starts{': 1' if starts == 1 else ''}" in sentence
        )
        assert html.index('id="metrics-kmeans"') < html.index('<table id="metric-table">')
    assert report.kmeans_sentence({"metrics": {}}) == report.kmeans_sentence(None) == ""


def test_report_with_nothing_but_a_name(tmp_path: Path) -> None:
    html = report.render_dataset_report(tmp_path / "r.html", dataset="empty")
    assert "No dataset statistics available" in html
    assert "No training history available" in html
    assert "No metrics available" in html
    assert "No attention maps available" in html
    assert_self_contained(html)


@pytest.mark.parametrize("compared", [[0.0, 0.0, 0.0], [0.0, 2.0, 3.0]], ids=["never", "acted"])
def test_the_training_section_warns_when_the_cluster_term_never_acted(
    tmp_path: Path, compared: list[float]
) -> None:
    history = pd.DataFrame(
        {"epoch": [1, 2, 3, 4], "train_recon": [1.0, 0.8, 0.7, 0.6], "lr": 1e-3,
         "clusters_compared": [np.nan, *compared]}
    )  # fmt: skip
    history.to_csv(tmp_path / "history.tsv", sep="\t", index=False)
    html = report.render_dataset_report(
        tmp_path / "r.html", dataset="d", history_tsv=tmp_path / "history.tsv"
    )
    assert "clusters_compared" in html  # plotted, and named in the caption
    never = 'id="history-warning"' in html
    assert never == (max(compared) == 0)
    if never:
        assert "the cluster term never acted" in html


def test_the_training_section_says_when_the_batches_were_kept_apart(tmp_path: Path) -> None:
    """A run trained without the adversary whose latent clusters never held two batches
    (the shared check keeps such a run) kept the differences between batches: the
    report says so, and how to train with the adversary instead."""
    history = pd.DataFrame(
        {"epoch": [1, 2, 3], "train_recon": [1.0, 0.8, 0.7], "adversary_weight": 0.0,
         "clusters_compared": [np.nan, 0.0, 0.0]}
    )  # fmt: skip
    history.to_csv(tmp_path / "history.tsv", sep="\t", index=False)
    html = report.render_dataset_report(
        tmp_path / "r.html", dataset="d", history_tsv=tmp_path / "history.tsv"
    )
    assert 'id="history-warning"' in html
    assert "the differences between them are kept" in html
    assert "training.shared_check: false" in html
    assert "the cluster term never acted" not in html
    history.assign(adversary_weight=[0.0, 0.15, 0.3]).to_csv(
        tmp_path / "history.tsv", sep="\t", index=False
    )
    html = report.render_dataset_report(
        tmp_path / "r.html", dataset="d", history_tsv=tmp_path / "history.tsv"
    )
    assert "the cluster term never acted" in html


def test_umap_embedding_plot(tmp_path: Path, dataset) -> None:
    html = report.render_dataset_report(
        tmp_path / "r.html",
        dataset="u",
        integrated={"uncorrected": dataset["integrated"]["uncorrected"]},
        embedding="umap",
        label_key="cell_type",
    )
    assert 'alt="UMAP of uncorrected"' in html
    assert len(assert_self_contained(html)) == 2  # the plot and its legend


def test_malformed_inputs_are_input_errors(tmp_path: Path) -> None:
    np.savez(tmp_path / "a.npz", weights=np.zeros((1, 1, 2, 2)))
    with pytest.raises(InputError, match=r"token_chrom|attention"):
        report.render_dataset_report(
            tmp_path / "r.html", dataset="x", attention_npz=tmp_path / "a.npz"
        )
    np.savez(tmp_path / "b.npz", attention=np.zeros((1, 1, 3, 3)), token_chrom=np.array(["1"]))
    with pytest.raises(InputError, match="1 entries for 3 tokens"):
        report.render_dataset_report(
            tmp_path / "r.html", dataset="x", attention_npz=tmp_path / "b.npz"
        )
    (tmp_path / "s.json").write_text("{not json")
    with pytest.raises(InputError, match="cannot read dataset stats"):
        report.render_dataset_report(
            tmp_path / "r.html", dataset="x", stats_json=tmp_path / "s.json"
        )
    assert not (tmp_path / "r.html").exists()


def test_index_links_every_report(tmp_path: Path, dataset) -> None:
    summary = summarize(
        {EVIL_DATASET: dataset["dir"] / "metrics.tsv", "other": dataset["dir"] / "metrics.tsv"},
        {(EVIL_DATASET, "combat"): dataset["bench"]["baseline_combat"]},
        tmp_path / "summary.tsv",
    )
    assert len(summary) == 6
    html = report.render_index(
        tmp_path / "summary.tsv",
        {EVIL_DATASET: f"{EVIL_DATASET}/report.html", "other": "other/report.html"},
        tmp_path / "index.html",
    )
    assert (tmp_path / "index.html").read_text(encoding="utf-8") == html
    assert "<script" not in html.lower()
    assert "&lt;script&gt;alert(&#39;dataset&#39;)&lt;/script&gt;" in html
    assert_self_contained(html)
    hrefs = [a["href"] for t, a in parse(html).tags if t == "a"]
    assert "other/report.html" in hrefs
    assert "%3Cscript%3Ealert%28%27dataset%27%29%3C/script%3E/report.html" in hrefs
    assert "failed" in html and "ComBat needs at least 2 samples" in html
    with pytest.raises(ValueError, match="relative"):
        report.render_index(
            tmp_path / "summary.tsv", {"x": "https://example.org/r.html"}, tmp_path / "i2.html"
        )


def test_a_method_that_used_labels_says_so_in_the_table(tmp_path: Path) -> None:
    adata = synthetic(n_per=8, genes=30)
    adata = adata[adata.obs["batch"] != EVIL_BATCH].copy()
    adata.obs["cell_type"] = adata.obs["cell_type"].astype(str).replace(EVIL_LABEL, "t2")
    frame = pd.DataFrame(adata.X, index=adata.obs_names, columns=adata.var_names)
    frame.rename_axis("sample_id").to_parquet(tmp_path / "ordered.parquet")
    adata.obs.rename_axis("sample_id").reset_index().to_csv(
        tmp_path / "samples.tsv", sep="\t", index=False
    )
    integrated = {m: tmp_path / f"{m}.h5ad" for m in ("uncorrected", "combat_mod")}
    for method, path in integrated.items():
        run_baseline(
            method,
            tmp_path / "ordered.parquet",
            tmp_path / "samples.tsv",
            "batch",
            "cell_type",
            path,
            seed=0,
            covariates=["cell_type"] if method == "combat_mod" else (),
        )
    # scores made up (the real ones take a minute): only the names are under test
    rows = [
        {"method": m, "metric": name, "type": kind, "value": v, "status": "ok", "error": ""}
        for m, v in (("uncorrected", 0.4), ("combat_mod", 0.6))
        for name, kind in metrics.metric_names(True)
    ]
    pd.DataFrame(rows, columns=tables.COLUMNS).to_csv(
        tmp_path / "metrics.tsv", sep="\t", index=False
    )
    html = report.render_dataset_report(
        tmp_path / "r.html",
        dataset="d",
        metrics_tsv=tmp_path / "metrics.tsv",
        integrated=integrated,
        label_key="cell_type",
    )
    # the metrics table names the labels combat_mod kept; files and metrics keep its key
    assert '<td class="name">combat_mod (mod: cell_type)</td>' in html
    assert '<td class="name">uncorrected</td>' in html


def test_a_mapped_dataset_says_at_the_top_which_model_and_which_batches_were_new(
    tmp_path: Path,
) -> None:
    record = {
        "model": {"name": EVIL_DATASET, "weights": "x/model.pt", "config": "x/model.json"},
        "trained_batches": ["a", "b"],
        "new_batches": [EVIL_BATCH],
        "adapted": True,
        "adapt_epochs": 3,
        "genes": {"n_model_loci": 10, "n_present": 8, "n_missing": 2},
    }
    (tmp_path / "mapping.json").write_text(json.dumps(record))
    html = report.render_dataset_report(
        tmp_path / "r.html", dataset="q", mapping_json=tmp_path / "mapping.json"
    )
    top = html[: html.index("<nav>")]
    assert 'id="mapping-note"' in top and "trained on\n  2 batches (a, b)" in top
    assert "adapted for 3 epochs" in top and "8 of the model's 10 loci" in top
    assert EVIL_DATASET not in html and EVIL_BATCH not in html  # escaped
    assert "mapped onto" in html[html.index('id="training"') :]
    assert 'id="mapping-note"' not in report.render_dataset_report(tmp_path / "t.html", dataset="t")
    (tmp_path / "bad.json").write_text(json.dumps({"model": {}}))
    with pytest.raises(InputError, match=r"bad\.json: not a mapping report"):
        report.render_dataset_report(
            tmp_path / "b.html", dataset="b", mapping_json=tmp_path / "bad.json"
        )
    assert not (tmp_path / "b.html").exists()


def test_above_the_cap_every_method_is_embedded_on_the_same_capped_subsample(
    dataset, monkeypatch
) -> None:
    from locusformer.report import sections
    from locusformer.scoring.result_rows import open_result
    from locusformer.scoring.subsample import scoring_subsample

    monkeypatch.setattr(sections, "EMBEDDING_MAX_SAMPLES", 40)  # of the fixture's 121
    embedded: dict[str, tuple[pd.Index, tuple[int, ...]]] = {}
    coords_of = sections._embedding_coords

    def spy(result, seed: int, mode: str, stored=None):
        coords, axis = coords_of(result, seed, mode, stored)
        embedded[str(result.uns["method"])] = (result.obs_names, coords.shape)
        return coords, axis

    def refuse(*args, **kwargs):
        raise AssertionError(f"a result was read whole: {args}")

    monkeypatch.setattr(sections, "_embedding_coords", spy)
    monkeypatch.setattr(ad, "read_h5ad", refuse)  # only the drawn rows are read
    integrated = dataset["integrated"]
    obs = open_result(integrated["uncorrected"]).obs
    drawn = scoring_subsample(obs, "batch", "cell_type", 40, 7)

    section, summary_obs = sections.embedding_section(integrated, "batch", "cell_type", 7, "auto")
    assert set(embedded) == {"uncorrected", "harmony"}  # combat failed
    for method, (names, shape) in embedded.items():
        # the PCA (below UMAP_MIN_SAMPLES) computed on the drawn rows, the same per method
        assert shape == (40, 2) and set(names) == set(drawn), method
    assert section["subsample"] == (
        "A stratified subsample of 40 of the 121 samples (by batch and label, seed 7), the"
        " same for every method; the scores were computed on all of them."
    )
    assert len(summary_obs) == 121  # the summary still counts every sample

    # scored on a subsample larger than the cap: the drawn samples are of the scored ones
    embedded.clear()
    section, _ = sections.embedding_section(integrated, "batch", "cell_type", 7, "auto", 60)
    scored = scoring_subsample(obs, "batch", "cell_type", 60, 7)
    for method, (names, shape) in embedded.items():
        assert shape == (40, 2) and set(names) < set(scored), method
    assert section["subsample"] == (
        "Drawn from the stratified subsample the scores were computed on: 40 of its 60"
        " samples, of 121 in all (by batch and label, seed 7)."
    )


def test_the_embeddings_are_drawn_from_the_representations_scored(
    dataset, tmp_path, monkeypatch
) -> None:
    from locusformer.report import sections

    integrated = dataset["integrated"]
    outs = {m: tmp_path / f"{m}.tsv" for m in integrated}
    reps = tmp_path / "representations.h5ad"
    steps_metrics.run_dataset_metrics(
        integrated,
        integrated["uncorrected"],
        "batch",
        "cell_type",
        outs,
        seed=7,
        out_representations=reps,
    )
    coords_of = sections._embedding_coords
    drawn: list[dict[str, np.ndarray]] = []

    def spy(result, seed: int, mode: str, stored=None):
        coords, axis = coords_of(result, seed, mode, stored)
        drawn[-1][str(result.uns["method"])] = coords
        return coords, axis

    def refuse(*args, **kwargs):
        raise AssertionError("a representation was computed again")

    monkeypatch.setattr(sections, "_embedding_coords", spy)
    drawn.append({})
    sections.embedding_section(integrated, "batch", "cell_type", 7, "auto")
    monkeypatch.setattr(metrics, "scoring_representation", refuse)
    drawn.append({})
    sections.embedding_section(integrated, "batch", "cell_type", 7, "auto", representations=reps)
    computed, stored = drawn
    assert set(stored) == set(computed) == {"uncorrected", "harmony"}  # combat failed
    for method, coords in computed.items():  # the same representation: the same plot
        np.testing.assert_array_equal(stored[method], coords)
