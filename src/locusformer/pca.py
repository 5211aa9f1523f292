"""Principal components, shared by the baselines, the metrics, the design check and reports.

One rule for the number of components and one solver (ARPACK, seeded), so that every
step that works "on the PCA" of a matrix means the same components.
"""

from __future__ import annotations

import numpy as np

MAX_PCS = 50


def n_pcs(n_obs: int, n_vars: int, max_pcs: int = MAX_PCS) -> int:
    """Number of principal components: ``min(max_pcs, n_obs - 1, n_vars - 1)`` (at least 1)."""
    return max(1, min(max_pcs, n_obs - 1, n_vars - 1))


def pca(x: np.ndarray, n_comps: int, seed: int = 0) -> np.ndarray:
    """Principal components of ``x`` (centred, not scaled) with ARPACK, as float64."""
    from sklearn.decomposition import PCA

    x = np.asarray(x, dtype=np.float64)
    n_comps = min(n_comps, min(x.shape) - 1)
    if n_comps < 1:
        raise ValueError(f"cannot compute a PCA of a {x.shape[0]} x {x.shape[1]} matrix")
    return PCA(n_components=n_comps, svd_solver="arpack", random_state=seed).fit_transform(x)
