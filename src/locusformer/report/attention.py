"""The report's attention section: how the model attends, and to what.

From ``attention.npz`` (:func:`locusformer.infer.correct.write_attention`): the attention
pipeline drawn from the trained model's configuration (:mod:`locusformer.report.diagram`,
inline SVG), the mean attention between chromosomes (one small heat map) and the locus
patches that receive the most attention, with their genes (by symbol where the annotation
has one: :func:`gene_symbols`). A per-head map of every patch
against every other was unreadable beyond a few dozen patches; these two summaries stay
readable at any number.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd

from locusformer.errors import InputError, one_line
from locusformer.model.config import ModelConfig
from locusformer.report.diagram import attention_svg
from locusformer.report.figures import chromosome_attention_figure

#: Rows of the table of most attended patches, and genes named in each row.
TOP_PATCHES = 10
GENES_SHOWN = 8

PathLike = str | os.PathLike


def chromosome_attention(mean: np.ndarray, chrom: np.ndarray) -> tuple[list[str], np.ndarray]:
    """Chromosomes in token order and their (C, C) mean attention, relative to uniform.

    ``mean`` is (T, T) attention of query token (rows) on key token (columns). Entry
    (a, b) is the mean weight from a patch of chromosome a to a patch of chromosome b,
    times T: 1 where the patches of b get what uniform attention would give them.
    """
    names = list(dict.fromkeys(chrom.tolist()))
    index = {name: i for i, name in enumerate(names)}
    codes = np.array([index[c] for c in chrom.tolist()])
    onehot = np.eye(len(names))[codes]  # (T, C)
    sums = onehot.T @ mean @ onehot  # (C, C): weight summed over the pairs of a block
    pairs = np.outer(onehot.sum(0), onehot.sum(0))
    return names, sums / pairs * mean.shape[-1]


def top_patches(
    mean: np.ndarray,
    chrom: np.ndarray,
    genes: np.ndarray | None,
    n: int = TOP_PATCHES,
    symbols: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """The ``n`` patches (keys) most attended, averaged over queries, with their genes.

    ``received`` is the patch's mean weight over all queries times T (1 = uniform).
    ``genes`` is (T, P) gene ids, "" in padding slots, or None when not recorded; a gene
    is named by its symbol in ``symbols`` (id -> symbol), by its id where it has none.
    """
    T = mean.shape[-1]
    received = mean.mean(axis=0) * T  # (T,)
    order = np.argsort(-received, kind="stable")[:n]
    symbols = symbols or {}
    rows = []
    for rank, token in enumerate(order, start=1):
        ids = [] if genes is None else [g for g in genes[token].tolist() if g]
        named = [symbols.get(g) or g for g in ids]
        shown = ", ".join(named[:GENES_SHOWN])
        if len(ids) > GENES_SHOWN:
            shown += f" … {len(ids) - GENES_SHOWN} more"
        rows.append(
            {
                "rank": rank,
                "token": int(token),
                "chrom": str(chrom[token]),
                "received": float(received[token]),
                "n_genes": len(ids),
                "genes": shown,
            }
        )
    return rows


def gene_symbols(
    loci_parquet: PathLike | None, genes: np.ndarray | None = None, npz_symbols=None
) -> dict[str, str]:
    """Gene id -> symbol, where the annotation gave one ({} where it gave none).

    From the ``symbol`` column of the loci table (``loci.parquet``), else from an
    attention map's ``token_symbols`` (``npz_symbols``, (T, P) beside ``genes``). An empty
    or missing symbol is left out: the gene keeps its id.
    """
    out: dict[str, str] = {}
    if genes is not None and npz_symbols is not None and npz_symbols.shape == genes.shape:
        out.update(zip(genes.ravel().tolist(), npz_symbols.ravel().tolist(), strict=True))
    if loci_parquet is not None:
        try:
            import pyarrow.parquet as pq

            names = pq.read_schema(loci_parquet).names
            if "symbol" in names and "gene_id" in names:
                loci = pd.read_parquet(loci_parquet, columns=["gene_id", "symbol"])
                out.update(zip(loci["gene_id"].astype(str), loci["symbol"], strict=True))
        except Exception as exc:
            raise InputError(loci_parquet, f"cannot read loci: {one_line(exc)}") from exc
    return {
        str(k): str(v).strip()
        for k, v in out.items()
        if k and isinstance(v, str) and v.strip() and v.strip().lower() not in ("nan", "na")
    }


def _diagram(text: str, path: PathLike, shape: tuple[int, ...]) -> str:
    """The flow diagram of the model whose configuration (JSON) is ``text``."""
    try:
        config = ModelConfig.from_dict(json.loads(text))
    except (json.JSONDecodeError, TypeError, InputError) as exc:
        raise InputError(path, f"model_config is not a model configuration ({exc})") from None
    if (config.n_layers, config.n_heads) != shape[:2]:
        raise InputError(
            path,
            f"attention has {shape[0]} layers x {shape[1]} heads, its model_config "
            f"{config.n_layers} x {config.n_heads}",
        )
    return attention_svg(config, n_tokens=shape[-1])


def attention_section(attention_npz: PathLike | None, loci_parquet: PathLike | None = None) -> dict:
    """The diagram, chromosome-level map and most attended patches of ``attention.npz``.

    The patches' genes are named by symbol where the loci table (``loci_parquet``) or the
    map itself (``token_symbols``) has one (:func:`gene_symbols`), else by id.
    """
    section: dict[str, Any] = {"available": False}
    if attention_npz is None:
        return section
    try:
        with np.load(attention_npz, allow_pickle=False) as npz:
            att = np.asarray(npz["attention"], dtype=np.float64)
            chrom = np.asarray(npz["token_chrom"]).astype(str)
            genes = np.asarray(npz["token_genes"]).astype(str) if "token_genes" in npz else None
            token_symbols = (
                np.asarray(npz["token_symbols"]).astype(str) if "token_symbols" in npz else None
            )
            config = str(npz["model_config"]) if "model_config" in npz else None
    except KeyError as exc:
        raise InputError(
            attention_npz, f"no array {exc} (need 'attention' and 'token_chrom')"
        ) from exc
    except Exception as exc:
        raise InputError(attention_npz, f"cannot read attention maps: {one_line(exc)}") from exc
    if att.ndim == 3:
        att = att[None]
    if att.ndim != 4 or att.shape[-1] != att.shape[-2]:
        raise InputError(attention_npz, f"attention must be (layers, heads, T, T), got {att.shape}")
    t = att.shape[-1]
    if chrom.shape != (t,):
        raise InputError(attention_npz, f"token_chrom has {chrom.size} entries for {t} tokens")
    if genes is not None and (genes.ndim != 2 or genes.shape[0] != t):
        raise InputError(attention_npz, f"token_genes must be ({t}, patch size), got {genes.shape}")
    mean = np.nanmean(att, axis=(0, 1))  # (T, T), over layers and heads
    names, between = chromosome_attention(mean, chrom)
    symbols = gene_symbols(loci_parquet, genes, token_symbols) if genes is not None else {}
    top = top_patches(mean, chrom, genes, symbols=symbols)
    section.update(
        available=True,
        diagram=_diagram(config, attention_npz, att.shape) if config is not None else None,
        figure=chromosome_attention_figure(names, between),
        top=top,
        genes_known=genes is not None,
        # which names the genes column shows: "symbols", "ids" or both (symbols where known)
        gene_names=_gene_names(genes, symbols),
        n_layers=att.shape[0],
        n_heads=att.shape[1],
        n_tokens=t,
        n_chrom=len(names),
    )
    return section


def _gene_names(genes: np.ndarray | None, symbols: Mapping[str, str]) -> str:
    """What names the table's genes column shows: symbols, ids, or symbols where known."""
    if genes is None or not symbols:
        return "ids"
    ids = {g for g in genes.ravel().tolist() if g}
    return "symbols" if ids <= symbols.keys() else "symbols where known, else ids"
