TRAIN_RESOURCES = config["resources"]["train"]


rule train:
    input:
        matrix="results/{dataset}/ordered.parquet",
        loci="results/{dataset}/loci.parquet",
        samples="results/{dataset}/samples.tsv",
        # How the data were normalized, recorded in the model so that `map` prepares new
        # data the same way.
        stats="results/{dataset}/stats/normalize.json",
    output:
        weights="results/{dataset}/model/model.pt",
        config="results/{dataset}/model/model.json",
        history="results/{dataset}/model/history.tsv",
    log:
        "logs/{dataset}/train.log",
    benchmark:
        "logs/benchmarks/{dataset}/train.tsv"
    wildcard_constraints:
        dataset=TRAINED_PATTERN,
    priority: CHAIN_PRIORITY
    conda:
        "../envs/torch.yaml"
    threads: TRAIN_RESOURCES["threads"]
    resources:
        gpu=TRAIN_RESOURCES["gpu"],
        cpus_per_gpu=TRAIN_RESOURCES["cpus_per_gpu"],
        # Each retry (profiles/slurm: retries) asks for more memory.
        mem_mb=lambda wildcards, attempt: TRAIN_RESOURCES["mem_mb"] * attempt,
        runtime=TRAIN_RESOURCES["runtime"],
    params:
        batch_key=get_batch_key,
        train_params=get_train_params(),
        seed=SEED,
        device=config["device"],
        # Outside the declared outputs: Snakemake deletes those when a job fails, and a
        # retry or rerun must find the checkpoint to continue where training stopped.
        checkpoint=get_checkpoint,
        launcher=get_train_launcher,
        protect=get_train_protect_arg(),
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}} OMP_NUM_THREADS={threads}"
        " {params.launcher} train"
        " --matrix {input.matrix:q}"
        " --loci {input.loci:q} --samples {input.samples:q} --batch-key {params.batch_key}"
        " --params {params.train_params} --seed {params.seed} --device {params.device}"
        " {params.protect} --normalize-stats {input.stats:q}"
        " --checkpoint {params.checkpoint:q} --out-weights {output.weights:q}"
        " --out-config {output.config:q} --out-history {output.history:q} 2> {log:q}"


rule correct:
    input:
        matrix="results/{dataset}/ordered.parquet",
        samples="results/{dataset}/samples.tsv",
        weights="results/{dataset}/model/model.pt",
        config="results/{dataset}/model/model.json",
    output:
        corrected="results/{dataset}/corrected.parquet",
        latent="results/{dataset}/latent.parquet",
        h5ad="results/{dataset}/locusformer.h5ad",
    log:
        "logs/{dataset}/correct.log",
    benchmark:
        "logs/benchmarks/{dataset}/correct.tsv"
    wildcard_constraints:
        dataset=TRAINED_PATTERN,
    priority: CHAIN_PRIORITY
    conda:
        "../envs/torch.yaml"
    threads: 2
    resources:
        mem_mb=lambda wildcards, attempt: 4000 * attempt,
    params:
        batch_key=get_batch_key,
        reference=shlex.quote(config["correct"]["reference"]),
        residual="--add-residual" if config["correct"]["add_residual"] else "",
        chunk_size=config["correct"]["chunk_size"],
        device=config["device"],
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}} OMP_NUM_THREADS={threads}"
        " python -m locusformer correct --matrix {input.matrix:q}"
        " --samples {input.samples:q} --batch-key {params.batch_key}"
        " --weights {input.weights:q} --config {input.config:q}"
        " --reference {params.reference} {params.residual} --chunk-size {params.chunk_size}"
        " --device {params.device} --out-corrected {output.corrected:q}"
        " --out-latent {output.latent:q} --out-h5ad {output.h5ad:q} 2> {log:q}"


# The trained model's attention maps, for the report's attention section (a mapped
# dataset has none: they would be its model's, made on other data). Averaged over 256
# samples at most: one thread at any scale, held to it (PyTorch would take every core)
# so that the job shares the cores with the chain's.
rule attention_map:
    input:
        matrix="results/{dataset}/ordered.parquet",
        loci="results/{dataset}/loci.parquet",
        samples="results/{dataset}/samples.tsv",
        weights="results/{dataset}/model/model.pt",
        config="results/{dataset}/model/model.json",
    output:
        "results/{dataset}/model/attention.npz",
    log:
        "logs/{dataset}/attention_map.log",
    benchmark:
        "logs/benchmarks/{dataset}/attention_map.tsv"
    conda:
        "../envs/torch.yaml"
    threads: 1
    params:
        batch_key=get_batch_key,
        device=config["device"],
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}} OMP_NUM_THREADS={threads}"
        " python -m locusformer attention --matrix {input.matrix:q} --loci {input.loci:q}"
        " --samples {input.samples:q} --batch-key {params.batch_key}"
        " --weights {input.weights:q} --config {input.config:q} --device {params.device}"
        " --out {output:q} 2> {log:q}"


# The trained model's attention traced step by step on a few samples, for the report's
# "Attention, step by step". Mapped datasets have none: their model's trace is that of the
# dataset (or folder) it was trained on, as its attention maps are.
rule inspect:
    input:
        matrix="results/{dataset}/ordered.parquet",
        weights="results/{dataset}/model/model.pt",
        config="results/{dataset}/model/model.json",
    output:
        trace="results/{dataset}/inspect.json",
        text="results/{dataset}/inspect.txt",
    log:
        "logs/{dataset}/inspect.log",
    benchmark:
        "logs/benchmarks/{dataset}/inspect.tsv"
    wildcard_constraints:
        dataset=TRAINED_PATTERN,
    conda:
        "../envs/torch.yaml"
    threads: 1
    params:
        model=get_inspect_model,
        # A few samples are what a trace needs, drawn at random: the first rows of the
        # matrix may all be one batch's.
        n_samples=INSPECT_SAMPLES,
        seed=SEED,
        device=config["device"],
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}} OMP_NUM_THREADS={threads}"
        " python -m locusformer inspect --model {params.model:q} --matrix {input.matrix:q}"
        " --n-samples {params.n_samples} --seed {params.seed} --device {params.device}"
        " --json --out {output.trace:q} --out-text {output.text:q} 2> {log:q}"


# A dataset whose row names a model (another dataset or a folder) is mapped onto it:
# correct's outputs, where correct writes them, and what the mapping did.
rule map:
    input:
        unpack(get_model_files),
        expression=get_expression,
        samples="results/{dataset}/samples.tsv",
    output:
        corrected="results/{dataset}/corrected.parquet",
        latent="results/{dataset}/latent.parquet",
        h5ad="results/{dataset}/locusformer.h5ad",
        report="results/{dataset}/mapping.json",
    log:
        "logs/{dataset}/map.log",
    benchmark:
        "logs/benchmarks/{dataset}/map.tsv"
    wildcard_constraints:
        dataset=MAPPED_PATTERN,
    priority: CHAIN_PRIORITY
    conda:
        "../envs/map.yaml"
    threads: 2
    resources:
        mem_mb=lambda wildcards, attempt: 4000 * attempt,
    params:
        args=get_map_args,
        reference=shlex.quote(config["correct"]["reference"]),
        adapt_epochs=config["map"]["adapt_epochs"],
        seed=SEED,
        device=config["device"],
    shell:
        "PYTHONPATH=${{PYTHONPATH-$LOCUSFORMER_SRC}} OMP_NUM_THREADS={threads}"
        " python -m locusformer map --weights {input.weights:q} --config {input.config:q}"
        " --expression {input.expression:q} --samples {input.samples:q} {params.args}"
        " --reference {params.reference} --adapt-epochs {params.adapt_epochs}"
        " --seed {params.seed} --device {params.device}"
        " --out-corrected {output.corrected:q} --out-latent {output.latent:q}"
        " --out-h5ad {output.h5ad:q} --out-report {output.report:q} 2> {log:q}"
