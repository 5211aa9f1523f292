"""The model's and the training's settings: defaults, parsing and validation.

:class:`ModelConfig` is the architecture, :class:`TrainConfig` the optimization and the
objective. Both are plain dataclasses; :func:`config_from_dict` builds one from the
overrides of a config file and refuses unknown keys, wrong types and out-of-range values
with an :class:`~locusformer.errors.InputError` naming the key. The workflow's schema
(``workflow/schemas/config.schema.yaml``) states the same keys, so that a typo fails at
``snakemake -n``; a test keeps the two in step.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from locusformer.errors import InputError

Pooling = Literal["mean", "scaled_mean"]
PositionScale = Literal["rank", "coordinate"]
LocusEmbeddingMode = Literal["vector", "affine", "none"]
Adversary = Literal["confusion", "reversal"]
DataOnDisk = Literal["auto", "always", "never"]
Alignment = Literal["shared", "global"]
InputClusterCount = Literal["structure", "fixed"]
BatchMeanScope = Literal["clusters", "batches"]


def config_from_dict(cls: type, data: Mapping[str, Any] | None, source: str) -> Any:
    """Build dataclass ``cls`` from a mapping of overrides, validated.

    Unknown keys and values of the wrong type are :class:`InputError` naming the key, so a
    typo in a config file is never silently ignored. Numbers written as strings (YAML reads
    ``1e-3`` as a string) are converted.
    """
    data = dict(data or {})
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        if key not in fields:
            valid = ", ".join(sorted(fields))
            raise InputError(source, f"unknown key {key!r} (valid keys: {valid})")
        default = fields[key].default
        kwargs[key] = _coerce(value, type(default), f"{source}.{key}")
    config = cls(**kwargs)
    config.validate(source)
    return config


def _coerce(value: Any, kind: type, name: str) -> Any:
    """Convert ``value`` to ``kind`` (bool, int, float or str) or raise InputError."""
    number = not isinstance(value, bool)  # True is an int to Python, not to a config
    fractional = isinstance(value, float) and not value.is_integer()
    try:
        if kind is bool and isinstance(value, bool):
            return value
        if kind is int and number and not fractional:
            return int(value)
        if kind is float and number:
            return float(value)
        if kind is str and isinstance(value, str):
            return value
    except (TypeError, ValueError):
        pass
    raise InputError(name, f"expected a {kind.__name__}, got {value!r}")


def choices(cls: type) -> dict[str, tuple[str, ...]]:
    """The allowed values of every ``Literal`` field of dataclass ``cls``."""
    hints = typing.get_type_hints(cls)
    return {
        name: typing.get_args(hint)
        for name, hint in hints.items()
        if typing.get_origin(hint) is Literal
    }


def _check(cls: type, config: Any, source: str, rules: Mapping[str, Callable[[Any], bool]]):
    """Raise InputError for the first ``Literal`` field off its choices or rule broken."""
    for name, allowed in choices(cls).items():
        value = getattr(config, name)
        if value not in allowed:
            shown = ", ".join(map(repr, allowed))
            raise InputError(f"{source}.{name}", f"must be one of {shown}, got {value!r}")
    for name, ok in rules.items():
        if not ok(getattr(config, name)):
            raise InputError(f"{source}.{name}", f"invalid value {getattr(config, name)!r}")


@dataclass
class ModelConfig:
    """Architecture of a :class:`~locusformer.model.network.LocusFormer`.

    Sizes are the best of what a prototype on CellBench measured. ``pooling`` and
    ``locus_embedding`` were chosen by measurement on simulated data (see the functions
    and classes that use them).
    """

    # Consecutive loci per token (1 = one token per locus). 32 rather than 16: the same
    # scores on CellBench within a seed's spread, at half the tokens (training 1.9x faster).
    patch_size: int = 32
    d_model: int = 64
    n_heads: int = 4
    n_layers: int = 2
    latent_dim: int = 32
    pooling: Pooling = "scaled_mean"  # mean, or mean x sqrt(tokens)
    dropout: float = 0.1  # on the residual branches, feed-forward and decoder
    # On attention weights. Off: with it, CPU's fused attention falls back to the math
    # kernel and draws a T x T mask (measured 16x slower at 500 tokens).
    attn_dropout: float = 0.0
    mlp_ratio: int = 4  # width of the feed-forward layer, in multiples of d_model
    position_scale: PositionScale = "rank"  # token index, or genomic start
    coordinate_unit: float = 1e6  # base pairs per unit of position when "coordinate"
    # How the token's position enters: the sinusoidal encoding of position_scale's
    # position, a learned vector per token index, or not at all. True and False are what
    # configs and saved models from before the choice hold: "sinusoidal" and "none".
    positional_encoding: Literal["sinusoidal", "learned", "none"] = "sinusoidal"
    chromosome_embedding: bool = True  # learned embedding of the token's chromosome
    locus_embedding: LocusEmbeddingMode = "vector"  # how a locus's identity enters
    decoder_hidden: int = 256
    discriminator_hidden: int = 64

    @staticmethod
    def _legacy_position(value: Any) -> Any:
        """``positional_encoding`` of an old config (a bool) as the choice it meant."""
        if isinstance(value, bool):
            return "sinusoidal" if value else "none"
        return value

    def __post_init__(self) -> None:
        self.positional_encoding = self._legacy_position(self.positional_encoding)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ModelConfig:
        data = dict(data or {})
        if "positional_encoding" in data:
            data["positional_encoding"] = cls._legacy_position(data["positional_encoding"])
        return config_from_dict(cls, data, "model config")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self, source: str = "model config") -> None:
        positive = ["patch_size", "d_model", "n_heads", "n_layers", "latent_dim", "mlp_ratio"]
        positive += ["decoder_hidden", "discriminator_hidden"]
        for name in positive:
            if getattr(self, name) < 1:
                raise InputError(f"{source}.{name}", f"must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise InputError(
                f"{source}.d_model",
                f"{self.d_model} is not divisible by n_heads={self.n_heads}",
            )
        if self.d_model % 2:
            raise InputError(f"{source}.d_model", "must be even (sinusoidal encoding)")
        for name in ("dropout", "attn_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise InputError(
                    f"{source}.{name}", f"must be in [0, 1), got {getattr(self, name)}"
                )
        _check(ModelConfig, self, source, {"coordinate_unit": lambda v: v > 0})


@dataclass
class TrainConfig:
    """Optimization and objective settings."""

    # How the batch discriminator acts on the encoder. "confusion": the encoder minimizes
    # the cross-entropy of the (frozen) discriminator's output against the batch
    # frequencies, which pushes cells toward regions where the discriminator is unsure;
    # "reversal": the discriminator's gradient, reversed, which pushes them toward regions
    # where it is sure of another batch. With batches of different cell-type mixtures,
    # reversal pulled cells into cell types their batch lacks (CellBench's five sets:
    # protocol H1975 cells into the plate-only lines; issue 18).
    adversary: Adversary = "confusion"
    # Weight of the adversary's term for the encoder. 0.3 rather than 0.1 under
    # "confusion": two-protocol task 0.917 against 0.908, five sets 0.840 against 0.844
    # (three seeds each, within the spread).
    adversary_weight: float = 0.3
    # Whitened distance between the batches' latent means (batch_mean_distance). The
    # adversary alone saturated on simulated data (a perfect discriminator passes back no
    # gradient) and left a plain linear batch shift; this term removes what a linear
    # classifier finds, and then the adversary has something left to act on.
    batch_mean_weight: float = 0.5
    # Where the batch means are compared. "clusters": within soft clusters of the latent,
    # found again at each epoch's start once the ramp-up is over (before it, the term is
    # off), and only between batches that hold a fair share of a cluster (each cell
    # counted in its nearest cluster unless that cluster compares no two batches)
    # (locusformer.train.alignment.latent_clusters). "batches": whole batches, which asks
    # batches holding different mixtures of cell types to have equal means and removed
    # the biology wherever they did (issue 18: skewed five sets
    # 0.616 against 0.799, confounded pseudo-bulk 0.531 against 0.751, seed 0).
    batch_mean_scope: BatchMeanScope = "clusters"
    # Clusters of the "clusters" scope. Each minibatch estimates a mean per cluster and
    # batch, so a minibatch should hold a few samples of each (16 scored lower: 0.786
    # against 0.799 on the skewed five sets, 0.903 against 0.906 on protocols, seed 0).
    # Where the training set holds fewer than 3 a cluster and batch on average, the term
    # is off (train.alignment.enough_for_clusters: a 40-sample study in 4 batches).
    batch_mean_clusters: int = 8
    # Each sample counts in a cluster's comparison only as far as every batch compared
    # there holds its biology (losses.cluster_cover): the edge cells of a cell type that
    # some batches lack, spread by the soft assignment into a neighbouring shared
    # cluster, are not compared there with batches that hold only the neighbour, which
    # drew the type into it (issue 14: plate 2's reference, H838 into
    # H1975; label transfer 0.980 -> 0.998, mapped total 0.841 -> 0.858, three seeds).
    # Where every gate is open it changes nothing.
    batch_mean_cover: bool = True
    # Compare the batch means within each latent cluster crossed with the levels (the
    # input's clusters and the protected covariates), not within the latent cluster alone.
    # A latent cluster that joins two classes which the batches hold in different shares
    # compares each batch's mix of them, and the term then moves the classes toward one
    # another (the confounded designs' biology: confounded-0.6 bio 0.80 against 0.95
    # without the term). Crossed, each class is compared with itself. On the simulated
    # suite over three seeds confounded-0.6 0.809 against 0.709, strong-confounded 0.782
    # against 0.674, atlas-10-batches 0.848 against 0.774, no scenario lower by more than
    # 0.005; on CellBench five of eight tasks higher (five sets 0.873 against 0.863), the
    # no-batch split 0.917 against 0.921 over six seeds (docs/notes/2026-12-06.md).
    # Without levels (no input clusters, no protected covariates) nothing changes.
    batch_mean_levels: bool = True
    # Epochs added to the run, as a share of its planned epochs (20 at the defaults), the
    # cluster term acting through them, when at its first epoch every cluster holds a
    # fair share of every batch: the batches hold the same biology, so no cell type is
    # drawn toward one that some batch lacks, which is how a longer term collapses
    # batches of different mixtures (issue 18).
    # Where any cluster is left to some batches the run is as without it. 0 (off) by
    # default: beside input_clusters, which remove the batch within shared biology from
    # the first epoch, it no longer paid (two protocols 0.931 against 0.921, RNA mixtures
    # 0.724 against 0.718, three seeds; the simulated suite equal or higher on all 29
    # scenarios; docs/notes/2026-12-05.md), and it cost the demo 20 epochs.
    shared_extension: float = 0.0
    # With protected covariates only: weight of the batch's share of the latent's
    # variance within each protected level (losses.level_batch_share), from the first
    # epoch. The adversary alone, told the levels, left the batch in the confounded
    # pseudo-bulk (0.768 against ComBat with mod's 0.784; with the term 0.787, three
    # seeds; issue 18). No effect without protected covariates.
    level_mean_weight: float = 1.0
    # Clusters of the input, corrected quickly and without labels (ComBat, each batch
    # re-centred on its mutual nearest neighbours, PCA, k-means;
    # train.alignment.input_levels), within which the level term removes the batch from
    # the first epoch. The latent's clusters decide the same only once the latent is
    # mixed, and a strong batch effect that still splits it closes every gate (issue 38).
    # The adversary's target is left to the protected covariates. 8 rather than 0 (off):
    # every CellBench task higher over three seeds (pooled RNA mixtures 0.943 against
    # 0.795, confounded pseudo-bulk 0.781 against 0.757) and the simulated suite's mean
    # 0.796 against 0.656, no scenario lower (seed 0; docs/notes/2026-12-05.md). 0 disables.
    input_clusters: int = 8
    # How many input clusters: "structure", as many as the quick correction has
    # principal axes above a shuffled null, plus one, at most input_clusters
    # (train.alignment.cluster_count); "fixed", input_clusters. "structure" rather than
    # "fixed": the simulated suite's mean 0.835 against 0.831, 19 scenarios higher and
    # 4 lower (the graded mixtures, at most -0.016), three seeds; every CellBench task
    # but the confounded pseudo-bulk still cuts 8 (docs/notes/2026-12-07.md).
    input_cluster_count: InputClusterCount = "structure"
    # How soft each sample's membership of the input clusters is in the level term: a
    # softmax over the clusters of minus its squared distance to each centroid in the
    # quick correction's scores, over this times the mean squared distance to the own
    # centroid (train.alignment.level_responsibilities). 0: hard, each sample in its
    # cluster alone. Where noise decides which cluster a sample of a continuum falls in,
    # hard clusters align differently selected samples of each batch. 0 rather than
    # 0.1: at 0.1 the nine-cell plates 0.564 against 0.548 and the skewed five sets 0.831
    # against 0.816, the rest of CellBench and the simulated suite's mean as hard, but
    # mixtures-confounded 0.013 lower and the suite's shallow library lower by up to
    # 0.019 (three seeds; docs/notes/2026-12-07.md).
    input_cluster_softness: float = 0.0
    mmd_weight: float = 0.0
    # Which batches each sample is aligned with (locusformer.train.alignment). "shared": only
    # those holding its biology, found label-free as mutual nearest neighbours, so a cell
    # type that one batch alone holds is not pulled toward the others; "global": every
    # batch, at the batch frequencies.
    alignment: Alignment = "global"
    alignment_neighbors: int = 20  # k of the mutual nearest neighbours
    # Latent cycle-consistency (sysVI): each sample is decoded to another batch, encoded
    # again, and its latent should not move. It removes the batch without asking the
    # batches to hold the same biology. 0 disables it (and its second encoder pass).
    cycle_weight: float = 0.0
    adversary_rampup_epochs: int = 20  # all batch-removal weights ramp up linearly
    lr: float = 1e-3
    weight_decay: float = 1e-2
    batch_size: int = 64
    # The whole cosine schedule runs (no early stopping by default, as in scvi-tools).
    # Stopped early, two of three seeds ended at epochs 33 and 47 of 80 with the learning
    # rate still high, and the score varied with the seed (cellbench5, three seeds:
    # 0.827-0.853; 40 epochs to the end: 0.838-0.853, in less time).
    max_epochs: int = 40
    # Optimizer steps an epoch-count setting is sized for: convergence follows the number
    # of updates, not of passes. When max_epochs passes would take more (large data), an
    # epoch is max_steps / max_epochs minibatches of a fresh shuffle instead of a pass,
    # so the ramp-up and the clusters found at each epoch's start act as on small data
    # (schedule.epoch_plan).
    max_steps: int = 2000
    # The fewest optimizer steps a run takes. Sized in epochs alone, a bulk study of 50
    # samples got 40 steps at batch size 64 (one a epoch) and a decoder that had not
    # learned the biology yet; on small data more epochs run, the ramp-up scaled alike.
    min_steps: int = 0
    # A pass shorter than this many minibatches is not an epoch: the epoch is that many
    # from successive shuffles, every epoch-counted setting as it is (small studies took
    # one step an epoch). Off: it lowered CellBench's pseudo-bulk (docs/notes/2026-12-05.md).
    # 0: an epoch is a pass.
    min_epoch_steps: int = 0
    # A run planned at fewer optimizer steps than this that did not learn the data is
    # trained again with min_steps set to it (train.refit): its decoder reconstructs less
    # than a fifth of the structure the data hold above noise, or its corrected matrix
    # explains less than 0.6 of the quick correction's structure. A floor only where the
    # decoder has not learned. 300 rather than 0 (never): the suite's 40-sample studies,
    # 40 steps at the defaults, rose (n-40 0.416 to 0.740, bulk-6-batches 0.834 to 0.896,
    # bulk-confounded 0.605 to 0.671, three seeds); every other suite scenario and every
    # CellBench task plans 300 steps or more or kept its run (least readings 0.26 and
    # 0.72), so their results are as before (docs/notes/2026-12-06.md).
    refit_steps: int = 300
    # A run planned at refit_steps or more, and at no more than max_steps over this,
    # whose input clusters were found and whose corrected matrix explains less than 0.6
    # of the quick correction's structure, is trained again with min_steps set to this
    # many times its planned steps: on shallow counts a 600-cell run's 400 steps can end
    # before the decoder learned the biology. A run near max_steps is left as it is (two
    # 3,000-cell runs trained three times as long: -0.011 and +0.035), and large data
    # keep their time (docs/notes/2026-12-07.md). 1: never.
    refit_factor: float = 3.0
    # A run whose corrected matrix explains less than 0.6 of the structure of the input
    # corrected quickly (ComBat, mutual-neighbour re-centring) is trained again without
    # the input clusters (train.fold). Off by default: the folds it was built for came
    # from clusters cut along a batch axis that the re-centring's median made on shallow
    # counts (the mean makes none), and on shallow counts it undid runs better than the
    # ones it trained again, reading the noise of the quick correction's axes as lost
    # structure (docs/notes/2026-12-07.md).
    fold_check: bool = False
    # A run with neither input clusters nor protected covariates whose latent clusters
    # never held a fair share of two batches is trained again without the adversary
    # (train.loop._unshared_config): nothing says the batches share any biology, and the
    # adversary then removes the biology that tells them apart. On the simulated suite
    # only confounded-total meets the condition (every batch one group; 0.654 -> 0.697,
    # the batch score unchanged, three seeds); no CellBench task does
    # (docs/notes/2026-12-06.md). Where the input holds no structure within batches, the
    # run is trained first without the adversary (train.loop._alone_config;
    # docs/notes/2026-12-08.md).
    shared_check: bool = True
    warmup_fraction: float = 0.05  # of all steps, then cosine decay to 0
    grad_clip: float = 1.0  # max global gradient norm; 0 disables clipping
    # Share of the samples held out (stratified by batch) from training, to choose the
    # kept epoch and for early stopping; 0: none, the last epoch kept. None by default:
    # every sample is corrected, and a held-out one by a decoder that never fitted it. On
    # 40 samples that tenth cost 0.025 of the total; where every batch is one group its
    # choice of epoch was worth 0.012 (docs/notes/2026-12-07.md).
    val_fraction: float = 0.0
    # Epochs without improvement of the held-out reconstruction (the training one where
    # none is held out) before stopping; 0: no early stopping. With samples held out the
    # epoch of their best reconstruction after the ramp-up is kept.
    patience: int = 0
    # Processes, one per device (GPU, or CPU process with gloo), trained with
    # DistributedDataParallel; launched by torchrun (the train rule does). batch_size stays
    # the global batch: each step splits it across the processes.
    devices: int = 1
    # Where run_train keeps the matrix: "never" in memory (standardized once), "always" in
    # a float32 .npy memory map read per minibatch, "auto" on disk when it would not fit
    # comfortably in memory. The same numbers either way.
    data_on_disk: DataOnDisk = "auto"
    # torch.compile the encoder (the attention blocks, where the time goes); the first
    # steps pay the compilation (tens of seconds). Off by default: on the one GPU
    # measured (an H200) it was not faster (issue 42).
    compile: bool = False

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> TrainConfig:
        return config_from_dict(cls, data, "train config")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self, source: str = "train config") -> None:
        rules: dict[str, Callable[[Any], bool]] = {
            "adversary_weight": lambda v: v >= 0,
            "adversary_rampup_epochs": lambda v: v >= 0,
            "batch_mean_weight": lambda v: v >= 0,
            "batch_mean_clusters": lambda v: v >= 1,
            "shared_extension": lambda v: v >= 0,
            "level_mean_weight": lambda v: v >= 0,
            "input_clusters": lambda v: v >= 0,
            "input_cluster_softness": lambda v: v >= 0,
            "mmd_weight": lambda v: v >= 0,
            "alignment_neighbors": lambda v: v >= 1,
            "cycle_weight": lambda v: v >= 0,
            "lr": lambda v: v > 0,
            "weight_decay": lambda v: v >= 0,
            "batch_size": lambda v: v >= 1,
            "max_epochs": lambda v: v >= 1,
            "max_steps": lambda v: v >= 1,
            "min_steps": lambda v: v >= 0,
            "min_epoch_steps": lambda v: v >= 0,
            "refit_steps": lambda v: v >= 0,
            "refit_factor": lambda v: v >= 1,
            "warmup_fraction": lambda v: 0 <= v < 1,
            "grad_clip": lambda v: v >= 0,
            "val_fraction": lambda v: 0 <= v < 1,
            "patience": lambda v: v >= 0,
            "devices": lambda v: v >= 1,
        }
        _check(TrainConfig, self, source, rules)


def split_params(params: Mapping[str, Any] | None) -> tuple[ModelConfig, TrainConfig]:
    """{"model": {...}, "train": {...}} overrides -> the two configs."""
    params = dict(params or {})
    unknown = set(params) - {"model", "train"}
    if unknown:
        raise InputError("params", f"unknown key {sorted(unknown)[0]!r} (valid keys: model, train)")
    return ModelConfig.from_dict(params.get("model")), TrainConfig.from_dict(params.get("train"))
