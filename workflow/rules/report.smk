# Above metrics.max_samples the embeddings are drawn from the subsample the metrics rule
# scored (same strata and seed), and of 10,000 samples at most: UMAP would not finish on
# an atlas, nor the reading fit.
rule report:
    input:
        unpack(get_report_inputs),
    output:
        html=report(
            "results/{dataset}/report.html",
            caption="../report/dataset_report.rst",
            category="Reports",
            labels={"dataset": "{dataset}"},
        ),
        figures=report(
            directory("results/{dataset}/figures"),
            patterns=["{name}.png"],
            caption="../report/figures.rst",
            category="Figures",
            subcategory="{dataset}",
            labels={"dataset": "{dataset}", "figure": "{name}"},
        ),
    log:
        "logs/{dataset}/report.log",
    benchmark:
        "logs/benchmarks/{dataset}/report.tsv"
    priority: CHAIN_PRIORITY
    conda:
        "../envs/report.yaml"
    params:
        results=get_report_results,
        model=get_report_model_args,
        benchmarks=get_report_benchmarks,
        batch_key=get_batch_key,
        label=get_label_arg,
        run_config=shlex.quote(json.dumps(config, sort_keys=True)),
        seed=SEED,
        max_samples=config["metrics"]["max_samples"],
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}}"
        " python -m locusformer report --dataset {wildcards.dataset} --metrics {input.metrics:q}"
        " --representations {input.representations:q}"
        " --stats {input.stats:q} --loci {input.loci:q} {params.model}"
        " --confounding {input.confounding:q}"
        " {params.results} {params.benchmarks}"
        " --config {params.run_config} --seed {params.seed} --batch-key {params.batch_key}"
        " {params.label} --max-samples {params.max_samples}"
        " --figures {output.figures:q} --out {output.html:q} 2> {log:q}"


rule index:
    input:
        summary="results/summary.tsv",
        reports=expand("results/{dataset}/report.html", dataset=DATASETS.index),
        confounding=expand("results/{dataset}/confounding.json", dataset=DATASETS.index),
    output:
        report(
            "results/index.html",
            caption="../report/index.rst",
            category="Reports",
            labels={"dataset": "all"},
        ),
    log:
        "logs/index.log",
    benchmark:
        "logs/benchmarks/index.tsv"
    priority: CHAIN_PRIORITY
    conda:
        "../envs/report.yaml"
    params:
        reports=get_index_reports,
        confounding=get_index_confounding,
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}}"
        " python -m locusformer index --summary {input.summary:q} {params.reports}"
        " {params.confounding} --out {output:q} 2> {log:q}"
