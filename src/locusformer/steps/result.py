"""``locusformer locusformer-result``: LocusFormer's corrected matrix or latent as an
integration result, the format every method hands to scoring."""

from __future__ import annotations

import logging
import os
from typing import Literal

PathLike = str | os.PathLike

log = logging.getLogger("locusformer")


def run_locusformer_result(
    *,
    h5ad: PathLike,
    batch_key: str,
    label_key: str | None,
    representation: Literal["matrix", "embedding"],
    method: str,
    out: PathLike,
) -> None:
    """Write the corrected matrix or the latent of ``h5ad`` as ``method``'s result."""
    from locusformer.baselines.methods import display_name
    from locusformer.io.results import make_result, write_result
    from locusformer.scoring.result_rows import open_result, read_element

    # Only the element this result keeps is read: the whole .h5ad (input, corrected layer
    # and latent) is 16 GB at 1M samples x 2,000 loci.
    corrected = open_result(h5ad, "corrected .h5ad")
    keys = [batch_key, label_key]
    if representation == "matrix":
        result = make_result(
            read_element(corrected.path, "layers/corrected", "corrected .h5ad"),
            method=method,
            representation="matrix",
            obs=corrected.obs,
            var_names=corrected.var_names,
            batch_key=keys[0],
            label_key=keys[1],
        )
    else:
        result = make_result(
            None,
            method=method,
            representation="embedding",
            obs=corrected.obs,
            embedding=read_element(corrected.path, "obsm/X_locusformer", "corrected .h5ad"),
            batch_key=keys[0],
            label_key=keys[1],
        )
    protect = list(corrected.uns.get("locusformer", {}).get("protect", []))
    if protect:  # trained with labels: the report's rows must say so
        result.uns.update(covariates=protect, display_name=display_name(method, protect))
    write_result(result, out)
