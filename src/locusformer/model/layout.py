"""From the loci table to tokens: where each locus sits in the model's sequence.

The one place a table (pandas) meets the model's :class:`~locusformer.model.network.LocusLayout`
(tensors); :mod:`locusformer.model.network` itself knows tensors only.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from locusformer.errors import InputError
from locusformer.model.network import LocusLayout, chromosome_code


def build_layout(
    loci: pd.DataFrame, patch_size: int, position_scale: str = "rank", coordinate_unit: float = 1e6
) -> LocusLayout:
    """Cut the loci table (one row per column of X, in genomic order) into tokens.

    ``position_scale="rank"`` uses the token index; ``"coordinate"`` the mean genomic start
    of the token's loci in units of ``coordinate_unit`` (per chromosome, as the chromosome
    embedding tells chromosomes apart). Tokens without coordinates (unplaced loci) use
    their index within their run.
    """
    if "chrom" not in loci.columns:
        raise InputError("loci table", "missing column 'chrom'")
    if position_scale == "coordinate" and "start" not in loci.columns:
        raise InputError("loci table", "missing column 'start' (needed for coordinate positions)")
    n = len(loci)
    if n == 0:
        raise InputError("loci table", "has no rows")
    codes = np.array([chromosome_code(c) for c in loci["chrom"].tolist()], dtype=np.int64)
    if "start" in loci.columns:
        start = pd.to_numeric(loci["start"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    else:
        start = np.full(n, np.nan)
    if "placed" in loci.columns:
        start = np.where(loci["placed"].fillna(False).to_numpy(dtype=bool), start, np.nan)

    run_starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    run_ends = np.r_[run_starts[1:], n]
    index, position, chrom = [], [], []
    for a, b in zip(run_starts, run_ends, strict=True):
        for j, p in enumerate(range(a, b, patch_size)):
            slots = np.arange(p, p + patch_size)
            slots[slots >= b] = n  # padding slot
            index.append(slots)
            chrom.append(codes[a])
            real = slots[slots < n]
            if position_scale == "rank":
                position.append(float(len(position)))
            elif np.isfinite(start[real]).any():
                position.append(float(np.nanmean(start[real])) / coordinate_unit)
            else:
                position.append(float(j))
    return LocusLayout(
        token_index=torch.as_tensor(np.stack(index), dtype=torch.long),
        token_position=torch.as_tensor(position, dtype=torch.float32),
        token_chrom=torch.as_tensor(chrom, dtype=torch.long),
        n_loci=n,
    )
