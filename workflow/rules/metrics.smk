rule metrics:
    input:
        result="results/{dataset}/integrated/{method}.h5ad",
        uncorrected="results/{dataset}/integrated/uncorrected.h5ad",
    output:
        "results/{dataset}/metrics/{method}.tsv",
    log:
        "logs/{dataset}/metrics_{method}.log",
    benchmark:
        "benchmarks/out/{dataset}/metrics_{method}.tsv"
    conda:
        "../envs/metrics.yaml"
    threads: 2
    params:
        batch_key=get_batch_key,
        label=get_label_arg,
        seed=SEED,
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}} OMP_NUM_THREADS={threads}"
        " python -m locusformer metrics --result {input.result:q}"
        " --uncorrected {input.uncorrected:q} --method {wildcards.method}"
        " --batch-key {params.batch_key} {params.label} --seed {params.seed}"
        " --out {output:q} 2> {log:q}"


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
        "benchmarks/out/{dataset}/aggregate_metrics.tsv"
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
        "benchmarks/out/summarize.tsv"
    conda:
        "../envs/metrics.yaml"
    params:
        metrics=get_summary_metrics,
        benchmarks=get_summary_benchmarks,
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}}"
        " python -m locusformer summarize {params.metrics} {params.benchmarks}"
        " --out {output:q} 2> {log:q}"
