rule normalize:
    input:
        expression=get_expression,
        samples=get_samples,
    output:
        matrix="results/{dataset}/normalized.parquet",
        samples="results/{dataset}/samples.tsv",
        stats="results/{dataset}/stats/normalize.json",
    log:
        "logs/{dataset}/normalize.log",
    benchmark:
        "logs/benchmarks/{dataset}/normalize.tsv"
    priority: CHAIN_PRIORITY
    conda:
        "../envs/preprocess.yaml"
    params:
        samples=get_samples_arg,
        args=get_normalize_args,
        target_sum=config["normalize"]["target_sum"],
        min_samples=config["normalize"]["min_samples"],
        n_top_genes=config["normalize"]["n_top_genes"],
        hvg_max_samples=config["normalize"]["hvg_max_samples"],
        seed=SEED,
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}}"
        " python -m locusformer normalize --expression {input.expression:q} {params.samples}"
        " {params.args} --target-sum {params.target_sum} --min-samples {params.min_samples}"
        " --n-top-genes {params.n_top_genes} --hvg-max-samples {params.hvg_max_samples}"
        " --seed {params.seed} --out-matrix {output.matrix:q}"
        " --out-samples {output.samples:q}"
        " --out-stats {output.stats:q} 2> {log:q}"


# The raw counts of the kept genes, for scVI only: a job of its own, off the chain the
# report waits for, and none when no count-based baseline is asked for (at a million
# samples writing them took a third of normalize's time).
rule counts:
    input:
        expression=get_expression,
        matrix="results/{dataset}/normalized.parquet",
    output:
        "results/{dataset}/counts.parquet",
    log:
        "logs/{dataset}/counts.log",
    benchmark:
        "logs/benchmarks/{dataset}/counts.tsv"
    priority: BASELINE_PRIORITY
    conda:
        "../envs/preprocess.yaml"
    threads: 1
    params:
        args=get_counts_source_args,
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}} OMP_NUM_THREADS={threads}"
        " python -m locusformer counts --expression {input.expression:q} {params.args}"
        " --matrix {input.matrix:q} --out {output:q} 2> {log:q}"


rule order_loci:
    input:
        matrix="results/{dataset}/normalized.parquet",
        genes=get_genes,
    output:
        loci="results/{dataset}/loci.parquet",
        matrix="results/{dataset}/ordered.parquet",
        stats="results/{dataset}/stats/loci.json",
    log:
        "logs/{dataset}/order_loci.log",
    benchmark:
        "logs/benchmarks/{dataset}/order_loci.tsv"
    priority: CHAIN_PRIORITY
    conda:
        "../envs/preprocess.yaml"
    params:
        gene_id=get_gene_id,
        unplaced=config["loci"]["unplaced"],
        order=config["loci"]["order"],
        seed=SEED,
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}}"
        " python -m locusformer order-loci --matrix {input.matrix:q} --genes {input.genes:q}"
        " --gene-id {params.gene_id} --unplaced {params.unplaced}"
        " --order {params.order} --seed {params.seed}"
        " --out-loci {output.loci:q} --out-matrix {output.matrix:q}"
        " --out-stats {output.stats:q} 2> {log:q}"
