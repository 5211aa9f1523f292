"""Above 20,000 samples, every row in the cluster k-means gives it: a probe (issues 38, 42).

``train.alignment.input_levels`` finds the input's clusters on 20,000 sampled rows and
gives every other row the cluster of its nearest sampled row of its own batch, in the
uncorrected data's PCA. Where the clusters cut a group in two, that neighbour follows
the noise across the cut: on the 100k scale data it disagreed with the clusters' own
assignment for 10 to 16% of the rows of the two groups cut. With ``LF_FILL=predict`` in
the environment, this hook replaces the fill: the quick correction
(``train.alignment.quick_scores``) of all rows, k-means fitted on the same sampled rows
and every row given its nearest centre. Put this folder first on ``PYTHONPATH`` and run
the workflow (its rules keep a ``PYTHONPATH`` that is set):

    cd RUN && LF_FILL=predict PYTHONPATH=$REPO/benchmarks/quality/scale_levels:$REPO/src \\
        snakemake --snakefile $REPO/workflow/Snakefile --directory RUN --cores 2 \\
        results/summary.tsv

It holds every row's corrected values in memory (about 3 GB at 100k samples, far more at
1M): a probe for the 100k data, not for the product.
"""

import os

if os.environ.get("LF_FILL") == "predict":
    import numpy as np

    from locusformer.train import alignment, loop

    def _predicted_levels(X, codes, n_clusters, seed, *, max_samples=alignment.INPUT_MAX_SAMPLES):
        from sklearn.cluster import KMeans

        codes = np.asarray(codes)
        n = len(codes)
        if n <= max_samples:
            return alignment.input_levels(X, codes, n_clusters, seed)
        rows = alignment._input_rows(codes, max_samples, seed)
        scores = alignment.quick_scores(np.asarray(X, dtype=np.float32), codes, seed)
        if scores is None:
            return None
        kmeans = KMeans(n_clusters, n_init=10, random_state=seed).fit(scores[rows])
        return kmeans.predict(scores).astype(np.int64)

    loop.input_levels = _predicted_levels
