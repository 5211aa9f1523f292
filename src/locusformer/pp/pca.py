"""Principal components, shared by the baselines, the metrics, the design check and reports.

One rule for the number of components and one solver (ARPACK, seeded), so that every
step that works "on the PCA" of a matrix means the same components. For a matrix too
large to copy in float64 (atlas scale, issue 15), :func:`pca_scaled_blocks` gives the PCA
of its scaled, clipped version over row blocks, to ARPACK's numbers within solver tolerance.
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


#: values per row block of :func:`pca_scaled_blocks` (float64: 64 MB per block array)
BLOCK_VALUES = 2**23


class NonFiniteError(ValueError):
    """The matrix holds NaN or infinite values."""


def _row_blocks(n: int, block_rows: int):
    for a in range(0, n, block_rows):
        yield slice(a, min(a + block_rows, n))


def _block(x, rows: slice) -> np.ndarray:
    """Rows of ``x`` as a fresh float64 array (the arithmetic on it never touches ``x``)."""
    return np.array(x[rows], dtype=np.float64)


def column_moments(x, block_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Column means and standard deviations (``ddof=1``) of ``x`` in float64, over row
    blocks, in two passes (sum, then centred sum of squares); NaN or infinite values raise
    :class:`NonFiniteError`."""
    n, p = x.shape
    total = np.zeros(p)
    for rows in _row_blocks(n, block_rows):
        b = _block(x, rows)
        if not np.isfinite(b).all():
            raise NonFiniteError("the matrix contains non-finite values")
        total += b.sum(axis=0)
    mean = total / n
    ss = np.zeros(p)
    for rows in _row_blocks(n, block_rows):
        b = _block(x, rows)
        b -= mean
        ss += np.einsum("ij,ij->j", b, b)
    return mean, np.sqrt(ss / (n - 1))


def pca_scaled_blocks(
    x,
    n_comps: int,
    *,
    max_value: float = 10.0,
    block_rows: int | None = None,
) -> np.ndarray:
    """PCA of the scaled and clipped ``x``, streamed over row blocks, never making it.

    The components of ``pca(np.clip((x - mean) / sd, -max_value, max_value), n_comps)``
    (``sd`` with ``ddof=1``, 1 for constant columns: ``scanpy.pp.scale(max_value=)``) for
    a matrix too large to copy: the scaled rows are made a block at a time, four times
    (column sums, centred sums of squares, the Gram matrix, the scores). The covariance
    of the scaled, clipped rows, centred again (clipping moves the column means, and
    sklearn's PCA centres its input), is accumulated as an ``n_vars x n_vars`` float64
    Gram matrix; its top eigenvectors (:func:`numpy.linalg.eigh`) are the components,
    their signs set as sklearn's ``svd_flip(u_based_decision=False)`` sets them (the
    largest absolute loading of each component positive), and the scores are the centred
    scaled rows times the components.

    The result equals ARPACK's (:func:`pca`) to solver tolerance where the eigenvalues are
    well separated; components whose eigenvalues are (nearly) tied may come out rotated
    within their span, as from any other solver.

    Parameters
    ----------
    x
        (n_obs, n_vars) matrix, any float dtype (an ndarray, a memmap, or anything giving
        ``x[a:b]`` as an array); not modified.
    n_comps
        Number of components; at most ``min(n_obs, n_vars) - 1``, as for ARPACK.
    max_value
        Scaled values are clipped to ``[-max_value, max_value]``.
    block_rows
        Rows per block (default: about :data:`BLOCK_VALUES` values per block). Working
        memory is a few ``block_rows x n_vars`` float64 arrays, the ``n_vars x n_vars``
        Gram matrix and its eigenvectors, and the ``n_obs x n_comps`` result.

    Returns
    -------
    np.ndarray
        (n_obs, n_comps) float64 scores.

    Raises
    ------
    NonFiniteError
        When ``x`` holds NaN or infinite values.
    ValueError
        When ``x`` is too small for one component.
    """
    n, p = int(x.shape[0]), int(x.shape[1])
    n_comps = min(n_comps, min(n, p) - 1)
    if n_comps < 1:
        raise ValueError(f"cannot compute a PCA of a {n} x {p} matrix")
    if block_rows is None:
        block_rows = max(1, BLOCK_VALUES // p)
    if int(block_rows) < 1:
        raise ValueError(f"block_rows must be at least 1, got {block_rows}")
    block_rows = int(block_rows)
    mean, sd = column_moments(x, block_rows)
    sd[sd == 0] = 1.0

    def scaled(rows: slice) -> np.ndarray:
        b = _block(x, rows)
        b -= mean
        b /= sd
        return np.clip(b, -max_value, max_value, out=b)

    gram = np.zeros((p, p))
    zsum = np.zeros(p)
    for rows in _row_blocks(n, block_rows):
        z = scaled(rows)
        zsum += z.sum(axis=0)
        gram += z.T @ z  # numpy's matmul takes the symmetric (syrk) path for z.T @ z
    zmean = zsum / n
    gram -= n * np.outer(zmean, zmean)  # centred: sum of (z - zmean)'(z - zmean)
    _, vecs = np.linalg.eigh(gram)  # ascending eigenvalues
    v = np.ascontiguousarray(vecs[:, ::-1][:, :n_comps])  # (p, k), largest first
    # svd_flip(u_based_decision=False): the largest |loading| of each component positive
    top = np.argmax(np.abs(v), axis=0)
    v *= np.sign(v[top, np.arange(n_comps)])
    scores = np.empty((n, n_comps))
    for rows in _row_blocks(n, block_rows):
        z = scaled(rows)
        z -= zmean
        scores[rows] = z @ v
    return scores
