"""More reconstruction for small studies, without more of the batch terms (issue 38): a probe.

At batch size 64 a study of 40 samples gets one minibatch a pass, 40 optimizer steps in
all, and its corrected matrix scores below the uncorrected data (the suite's ``n-40``:
0.376 against 0.540): the decoder has not learned the biology. More steps of every term
(``training.min_steps``, ``min_epoch_steps``) lift the simulated small studies and lower
CellBench's pseudo-bulk (more batch-term updates there leave more batch). This probe
trains LocusFormer at its defaults, then fits the decoder alone for ``--steps`` more
steps on the reconstruction, the encoder frozen: the latent, and what it holds of the
batch, stay as trained; only how faithfully the corrected matrix decodes it changes.
Each model is scored as the suite scores it.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/decoder_steps.py --out OUT.tsv \\
        --scenarios n-40 n-150 bulk-6-batches bulk-confounded --steps 0 200 500
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/quality/decoder_steps.py --out OUT.tsv \\
        --tasks-work benchmarks/out/variants --tasks pseudobulk pseudobulk_confounded --steps 0 200

One row per (data set, steps, seed) appended to ``--out``: data set, variant, seed,
batch, bio, total, seconds (training plus the decoder's steps).
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from probes import append_row, each_dataset, probe_parser, score_matrix


def fit_decoder(model, X, codes: np.ndarray, steps: int, seed: int, lr: float = 1e-3) -> None:
    """In place: ``steps`` AdamW steps of the reconstruction loss on the decoder alone
    (minibatches of 64 of every row, the encoder's latent fixed), learning rate warmed up
    over 5% of the steps, then a cosine over all of them (its own schedule, not
    train.schedule.WarmupCosine, which starts the cosine after the warm-up: the probe's
    recorded rows used this one)."""
    import torch
    import torch.nn.functional as F

    net = model.module
    X = X.toarray() if hasattr(X, "toarray") else X
    xs = net.standardize(torch.as_tensor(np.asarray(X, dtype=np.float32)))
    b = torch.as_tensor(codes, dtype=torch.long)
    net.eval()
    with torch.no_grad():
        z = net.encode(xs)[0]
    params = list(net.decoder.parameters())
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=0.01)
    warm = max(1, round(0.05 * steps))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * s / steps)),
    )
    generator = torch.Generator().manual_seed(seed)
    net.decoder.train()
    done = 0
    while done < steps:
        for rows in torch.randperm(len(xs), generator=generator).split(64):
            loss = F.mse_loss(net.decode(z[rows], net.condition(b[rows])), xs[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            done += 1
            if done == steps:
                break
    net.eval()


def run(name, adata, loci, keys, seed, step_list, out: Path) -> None:
    import copy

    from locusformer.baselines.methods import run_method
    from locusformer.infer.correct import batch_codes, correct
    from locusformer.train.loop import train_corrector

    uncorrected = run_method("uncorrected", adata.copy(), keys[0], 0)
    batches = adata.obs[keys[0]].astype(str).tolist()
    start = time.perf_counter()
    trained, _ = train_corrector(adata.X, batches, loci, None, None, seed=seed, progress=False)
    seconds = time.perf_counter() - start
    codes = batch_codes(trained, batches)
    for steps in step_list:
        begin = time.perf_counter()
        model = copy.deepcopy(trained)
        if steps:
            fit_decoder(model, adata.X, codes, steps, seed)
        corrected, _ = correct(model, adata.X, batches)
        scores = score_matrix(corrected, adata, uncorrected, keys, seed)
        took = round(seconds + time.perf_counter() - begin, 1)
        append_row(out, [name, f"decoder_steps_{steps}", seed, *scores, took])


def main() -> None:
    parser = probe_parser(__doc__)
    parser.add_argument("--steps", nargs="+", type=int, default=[0, 200, 500])
    args = parser.parse_args()
    for name, adata, loci, keys, seed in each_dataset(args):
        run(name, adata, loci, keys, seed, args.steps, args.out)


if __name__ == "__main__":
    main()
