"""Write .test/data/ from the bundled demo (resources/demo): a quarter of the CellBench
cells, the same share of every protocol x cell line, and the 600 genes detected in the
most cells, as a genes x samples CSV and as a samples x genes .h5ad of the same counts.

Run from the repository root: python .test/make_data.py
"""

from pathlib import Path

import anndata as ad
import numpy as np
import pandas as pd
from scipy import sparse

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / ".test" / "data"

counts = pd.read_csv(ROOT / "resources/demo/cellbench_counts.tsv.gz", sep="\t", index_col=0)
sheet = pd.read_csv(ROOT / "resources/demo/cellbench_samples.tsv", sep="\t", index_col=0)
cells = sheet.groupby(["protocol", "cell_line"]).sample(frac=0.25, random_state=0)
counts = counts[cells.index]
detected = (counts > 0).sum(axis=1).sort_values(ascending=False, kind="stable")
counts = counts.loc[counts.index.isin(detected.index[:600])]  # demo order kept

OUT.mkdir(parents=True, exist_ok=True)
counts.to_csv(OUT / "tiny_counts.csv.gz")
cells.to_csv(OUT / "tiny_samples.csv")
adata = ad.AnnData(
    sparse.csr_matrix(counts.T.to_numpy(dtype=np.int32)),
    obs=cells.copy(),
    var=pd.DataFrame(index=counts.index),
)
adata.write_h5ad(OUT / "tiny.h5ad", compression="gzip", compression_opts=9)
