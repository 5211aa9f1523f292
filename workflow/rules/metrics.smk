# The design check, on the normalized matrix before any correction: how strongly the
# batch predicts the biology, which the report and the index read the scores against.
# One thread: it is ready with order_loci and runs beside it on 2 cores, off the chain
# the report waits for (its second BLAS thread saved 1 s of 7 at 10,000 samples).
rule confounding:
    input:
        matrix="results/{dataset}/normalized.parquet",
        samples="results/{dataset}/samples.tsv",
    output:
        report(
            "results/{dataset}/confounding.json",
            caption="../report/confounding.rst",
            category="Design check",
            subcategory="{dataset}",
        ),
    log:
        "logs/{dataset}/confounding.log",
    benchmark:
        "logs/benchmarks/{dataset}/confounding.tsv"
    conda:
        "../envs/preprocess.yaml"
    threads: 1
    params:
        batch_key=get_batch_key,
        label=get_label_arg,
        seed=SEED,
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}} OMP_NUM_THREADS={threads}"
        " python -m locusformer confounding --matrix {input.matrix:q}"
        " --samples {input.samples:q} --batch-key {params.batch_key} {params.label}"
        " --seed {params.seed} --out {output:q} 2> {log:q}"


# One job per dataset scores every method in one process: the JIT compilation (numba's
# of UMAP's graph for kBET, JAX's for the rest) and the uncorrected PCA are paid once, not
# per method.
# One BLAS thread: the matrices scored are n x 50, and on shared cores OpenBLAS's second
# thread made the PCA and kBET many times slower (same scores). The job claims one
# thread: on the demo it is mostly JAX's compilation, one core's work (7.3 s on one core
# or two), and a claim of two kept it waiting for attention_map and inspect to free the
# second core. On a large subsample JAX's own thread pool (XLA sizes it by the cores the
# job may use, whatever OMP_NUM_THREADS says) still runs the silhouettes, LISI and
# k-means on every core left to it; the SLURM profile asks for more (set-threads). Above
# metrics.max_samples samples every method is scored on one stratified subsample
# (locusformer.scoring.subsample), which each table records.
# KMeans NMI and ARI come from the best of metrics.kmeans_starts starts (1: scib-metrics').
# The representations scored (each method's PCA or embedding) go to representations.h5ad,
# from which the report draws its embeddings instead of computing every PCA again.
rule metrics:
    input:
        unpack(get_metrics_inputs),
    output:
        tables=expand("results/{{dataset}}/metrics/{method}.tsv", method=methods()),
        representations="results/{dataset}/metrics/representations.h5ad",
    log:
        "logs/{dataset}/metrics.log",
    benchmark:
        "logs/benchmarks/{dataset}/metrics.tsv"
    priority: CHAIN_PRIORITY
    conda:
        "../envs/metrics.yaml"
    threads: 1
    params:
        results=get_metrics_results,
        outputs=get_metrics_outputs,
        batch_key=get_batch_key,
        label=get_label_arg,
        seed=SEED,
        max_samples=config["metrics"]["max_samples"],
        kmeans_starts=config["metrics"]["kmeans_starts"],
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}} OMP_NUM_THREADS=1"
        " python -m locusformer metrics --uncorrected {input.uncorrected:q}"
        " {params.results} {params.outputs} --batch-key {params.batch_key}"
        " {params.label} --seed {params.seed} --max-samples {params.max_samples}"
        " --kmeans-starts {params.kmeans_starts}"
        " --out-representations {output.representations:q} 2> {log:q}"


rule aggregate_metrics:
    input:
        get_method_tables,
    output:
        report(
            "results/{dataset}/metrics.tsv",
            caption="../report/metrics.rst",
            category="Scores",
            subcategory="{dataset}",
        ),
    log:
        "logs/{dataset}/aggregate_metrics.log",
    benchmark:
        "logs/benchmarks/{dataset}/aggregate_metrics.tsv"
    priority: CHAIN_PRIORITY
    conda:
        "../envs/metrics.yaml"
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}}"
        " python -m locusformer aggregate-metrics {input:q} --out {output:q} 2> {log:q}"


rule summarize:
    input:
        metrics=expand("results/{dataset}/metrics.tsv", dataset=DATASETS.index),
        benchmarks=[path for _, _, path in get_benchmarks()],
    output:
        report(
            "results/summary.tsv",
            caption="../report/summary.rst",
            category="Scores",
            subcategory="All datasets",
        ),
    log:
        "logs/summarize.log",
    benchmark:
        "logs/benchmarks/summarize.tsv"
    conda:
        "../envs/metrics.yaml"
    params:
        metrics=get_summary_metrics,
        benchmarks=get_summary_benchmarks,
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}}"
        " python -m locusformer summarize {params.metrics} {params.benchmarks}"
        " --out {output:q} 2> {log:q}"
