"""The workflow's sample table (``samples.tsv``) and loci table (``loci.parquet``), read
with one-line errors: every step that takes them reads them here.
"""

from __future__ import annotations

import logging
import os

import pandas as pd

from locusformer.errors import InputError, one_line

log = logging.getLogger(__name__)


def read_sample_table(path: str | os.PathLike) -> pd.DataFrame:
    """Read ``samples.tsv`` (all columns as strings, indexed by ``sample_id``)."""
    try:
        samples = pd.read_csv(path, sep="\t", dtype=str, keep_default_na=False, na_values=[""])
    except Exception as exc:
        raise InputError(path, f"cannot read sample table: {one_line(exc)}") from exc
    if "sample_id" not in samples.columns:
        raise InputError(path, "no 'sample_id' column")
    if samples["sample_id"].duplicated().any():
        dup = samples.loc[samples["sample_id"].duplicated(), "sample_id"].iloc[0]
        raise InputError(path, f"duplicate sample id {dup!r}")
    return samples.set_index("sample_id")


def read_batches(
    samples_path: str | os.PathLike, batch_key: str, sample_ids: pd.Index
) -> pd.DataFrame:
    """The sample table, indexed by sample_id and ordered like ``sample_ids``."""
    try:
        table = pd.read_csv(samples_path, sep="\t", dtype=str, keep_default_na=False)
    except FileNotFoundError:
        raise InputError(samples_path, "file not found") from None
    except (pd.errors.ParserError, UnicodeDecodeError) as err:
        raise InputError(samples_path, f"cannot read TSV ({err})") from None
    for column in ("sample_id", batch_key):
        if column not in table.columns:
            raise InputError(samples_path, f"missing column {column!r}")
    table = table.set_index("sample_id")
    missing = sample_ids.difference(table.index)
    if len(missing):
        raise InputError(samples_path, f"no row for sample {missing[0]!r} ({len(missing)} missing)")
    table = table[~table.index.duplicated(keep="first")].loc[sample_ids]
    if (table[batch_key] == "").any():
        bad = table.index[table[batch_key] == ""][0]
        raise InputError(samples_path, f"empty {batch_key!r} for sample {bad!r}")
    return table


def read_loci(path: str | os.PathLike) -> pd.DataFrame:
    """Read ``loci.parquet`` (the order-loci step's table: one row per locus, in the
    model's token order, ``gene_id`` among its columns)."""
    try:
        loci = pd.read_parquet(path, engine="pyarrow")
    except FileNotFoundError:
        raise InputError(path, "file not found") from None
    except Exception as err:
        raise InputError(path, f"cannot read parquet ({type(err).__name__}: {err})") from None
    if "gene_id" not in loci.columns:
        raise InputError(path, "missing column 'gene_id'")
    return loci
