"""Readers of gene annotations: gene coordinates from a table, a GTF or a BED file.

Preprocessing places each gene of the matrix on the genome with them
(:func:`locusformer.pp.loci.order_loci`); every problem with the file is an
:class:`~locusformer.errors.InputError` that names it.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import re
import zlib
from pathlib import Path

import numpy as np
import pandas as pd

from locusformer.errors import InputError
from locusformer.io.tables import read_table, strip_gz

log = logging.getLogger(__name__)

PathLike = str | os.PathLike

ANNOTATION_COLUMNS = ["gene_id", "chrom", "start", "end"]
_GTF_ATTRIBUTE = re.compile(r'(\S+)\s+"([^"]*)"')


def annotation_format(path: PathLike) -> str:
    suffix, _ = strip_gz(Path(path))
    if suffix in {".gtf", ".gff", ".gff2"}:
        return "gtf"
    if suffix == ".bed":
        return "bed"
    if suffix in {".tsv", ".txt", ".tab", ".csv"}:
        return "table"
    raise InputError(path, "unsupported annotation type (expected .tsv/.csv, .gtf or .bed)")


def read_annotation(path: PathLike, gene_id: str) -> pd.DataFrame:
    """Read gene coordinates as a frame with columns gene_id, chrom, start, end.

    Parameters
    ----------
    path
        A table with ``chrom``, ``start``, ``end`` and an id column (like the bundled
        ``hs_gene_coordinates.tsv.gz``), a GTF (``gene`` records; ``gene_id`` names the
        attribute) or a BED file (name column = gene id; 0-based starts made 1-based).
    gene_id
        Which column (table) or attribute (GTF) holds the ids that the matrix uses.
    """
    path = Path(path)
    kind = annotation_format(path)
    if not path.is_file():
        raise InputError(path, "file not found")
    if kind == "table":
        frame = read_table(path, dtype=str, keep_default_na=False)
        missing = [c for c in ("chrom", "start", "end", gene_id) if c not in frame.columns]
        if missing:
            raise InputError(path, f"annotation lacks column(s): {', '.join(missing)}")
        keep = ANNOTATION_COLUMNS + (
            ["symbol"] if "symbol" in frame and gene_id != "symbol" else []
        )
        frame = frame.rename(columns={gene_id: "gene_id"})[keep]
    elif kind == "bed":
        frame = _read_bed(path)
    else:
        frame = _read_gtf(path, gene_id)
    frame = frame[frame["gene_id"].astype(str).str.strip() != ""].copy()
    if frame.empty:
        raise InputError(path, f"annotation has no records with a {gene_id!r} id")
    frame = numeric_spans(frame, path)
    return frame.reset_index(drop=True)


def numeric_spans(frame: pd.DataFrame, path: Path) -> pd.DataFrame:
    """Starts and ends as integers, each record a span on the genome (1 <= start <= end).

    Records without numbers are dropped with a warning (a GTF's or table's odd rows);
    an annotation with none, or with a span that cannot be (a start below 1, an end
    before its start), is refused: its order of loci would be wrong without a word.
    """
    raw = frame[["start", "end"]].copy()
    frame["start"] = pd.to_numeric(frame["start"], errors="coerce")
    frame["end"] = pd.to_numeric(frame["end"], errors="coerce")
    unusable = frame["start"].isna() | frame["end"].isna()
    if unusable.all():
        first = raw.iloc[0]
        raise InputError(
            path,
            f"start and end are not numbers (e.g. gene {frame['gene_id'].iloc[0]!r}: "
            f"start {first['start']!r}, end {first['end']!r})",
        )
    if unusable.any():
        log.warning("%s: %d record(s) without numeric start and end skipped", path, unusable.sum())
    frame = frame[~unusable].copy()
    frame["start"] = frame["start"].astype(np.int64)
    frame["end"] = frame["end"].astype(np.int64)
    impossible = (frame["start"] < 1) | (frame["end"] < frame["start"])
    if impossible.any():
        bad = frame[impossible].iloc[0]
        raise InputError(
            path,
            f"{int(impossible.sum())} record(s) are not spans on the genome (start >= 1 and "
            f"end >= start needed), e.g. gene {bad['gene_id']!r}: start {bad['start']}, "
            f"end {bad['end']}",
        )
    return frame


def _read_bed(path: Path) -> pd.DataFrame:
    _, compressed = strip_gz(path)
    opener = gzip.open if compressed else open
    try:
        # UCSC "track" and "browser" lines have fewer fields: drop them before parsing.
        with opener(path, "rt", encoding="utf-8-sig") as handle:
            lines = [line for line in handle if not line.startswith(("track", "browser", "#"))]
        frame = pd.read_csv(
            io.StringIO("".join(lines)), sep="\t", header=None, dtype=str, usecols=[0, 1, 2, 3]
        )
    except (ValueError, pd.errors.ParserError, EOFError, OSError, zlib.error) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__
        raise InputError(path, f"cannot parse BED (need at least 4 columns): {reason}") from None
    frame.columns = ["chrom", "start", "end", "gene_id"]
    frame["start"] = pd.to_numeric(frame["start"], errors="coerce") + 1
    return frame


def _read_gtf(path: Path, gene_id: str) -> pd.DataFrame:
    try:
        frame = pd.read_csv(
            path, sep="\t", header=None, comment="#", dtype=str, usecols=[0, 2, 3, 4, 8]
        )
    except (ValueError, pd.errors.ParserError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise InputError(path, f"cannot parse GTF (need 9 columns): {exc}") from None
    frame.columns = ["chrom", "feature", "start", "end", "attributes"]
    genes = frame[frame["feature"] == "gene"]
    if genes.empty:
        raise InputError(path, "GTF has no 'gene' records")
    ids = genes["attributes"].map(lambda text: dict(_GTF_ATTRIBUTE.findall(text)).get(gene_id))
    if ids.isna().all():
        raise InputError(path, f"GTF gene records have no {gene_id!r} attribute")
    return pd.DataFrame(
        {"gene_id": ids, "chrom": genes["chrom"], "start": genes["start"], "end": genes["end"]}
    ).dropna(subset=["gene_id"])


#: The human gene table of the source tree (an installed wheel does not ship it).
BUNDLED_ANNOTATION = (
    Path(__file__).resolve().parents[3] / "resources" / "hs_gene_coordinates.tsv.gz"
)


def bundled_annotation() -> Path | None:
    """:data:`BUNDLED_ANNOTATION` when this package runs from a source tree, else None."""
    return BUNDLED_ANNOTATION if BUNDLED_ANNOTATION.is_file() else None
