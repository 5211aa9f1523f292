rule baseline:
    input:
        unpack(get_baseline_input),
    output:
        "results/{dataset}/integrated/{method}.h5ad",
    log:
        "logs/{dataset}/baseline_{method}.log",
    benchmark:
        "logs/benchmarks/{dataset}/baseline_{method}.tsv"
    wildcard_constraints:
        method="|".join(BASELINES),
    priority: BASELINE_PRIORITY
    conda:
        "../envs/baselines.yaml"
    threads: get_baseline_threads
    params:
        batch_key=get_batch_key,
        label=get_label_arg,
        counts=get_counts_arg,
        protect=get_protect_arg,
        seed=SEED,
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}} OMP_NUM_THREADS={threads}"
        " python -m locusformer baseline --method {wildcards.method}"
        " --matrix {input.matrix:q} --samples {input.samples:q} {params.counts} {params.protect}"
        " --batch-key {params.batch_key} {params.label} --seed {params.seed}"
        " --out {output:q} 2> {log:q}"


rule locusformer_result:
    input:
        "results/{dataset}/locusformer.h5ad",
    output:
        "results/{dataset}/integrated/{method}.h5ad",
    log:
        "logs/{dataset}/result_{method}.log",
    benchmark:
        "logs/benchmarks/{dataset}/result_{method}.tsv"
    wildcard_constraints:
        method="|".join(LOCUSFORMER_METHODS),
    priority: CHAIN_PRIORITY
    conda:
        "../envs/baselines.yaml"
    params:
        representation=lambda wildcards: LOCUSFORMER_METHODS[wildcards.method],
        batch_key=get_batch_key,
        label=get_label_arg,
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}}"
        " python -m locusformer locusformer-result --h5ad {input:q} --method {wildcards.method}"
        " --representation {params.representation} --batch-key {params.batch_key}"
        " {params.label} --out {output:q} 2> {log:q}"
