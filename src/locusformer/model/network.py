"""The LocusFormer model: self-attention over gene loci in genomic order.

Read top to bottom:

1. ``ModelConfig`` (from :mod:`locusformer.model.config`) - every knob of the architecture.
2. ``linear`` and ``MultiHeadSelfAttention`` (from :mod:`locusformer.model.attention`) - the
   one place a linear layer runs, and the attention layer with its explicit and fused
   paths over one set of weights.
4. ``sinusoidal_encoding`` / ``LocusLayout`` / ``LocusEmbedding`` - how a row of the
   expression matrix becomes a sequence of tokens (patches of consecutive loci).
5. ``Block`` / ``Encoder`` / ``masked_mean`` - pre-norm transformer blocks, pooling.
6. ``GradientReversal`` / ``BatchDiscriminator`` / ``batch_mean_distance`` (whole
   batches or within clusters) / ``batch_mmd`` - the terms that push batch
   information out of the latent.
7. ``BatchConditionedDecoder`` - reconstructs every locus from (latent, batch).
8. ``LocusFormer`` - ties it together, owns the per-gene standardization and computes
   its own loss (``Loss``, weighted by ``LossWeights``).

The module knows tensors only: it imports torch, the standard library, the attention
layer and the batch-removal terms (:mod:`locusformer.model.losses`). The settings
are parsed in :mod:`locusformer.model.config`, the loci table becomes a ``LocusLayout`` in
:mod:`locusformer.model.layout`, and what a trained model carries beside its weights is in
:mod:`locusformer.train.checkpoint`.

Shapes in comments: B batch of samples, L loci, T tokens, P loci per token (patch size),
D model width, H heads, K = D // H head width, Z latent width, N number of batches.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from locusformer.model.attention import MultiHeadSelfAttention, linear
from locusformer.model.losses import (
    Clusters,
    batch_mean_distance,
    batch_mmd,
    cluster_batch_mean_distance,
    cluster_cover,
    cluster_responsibilities,
    confusion_loss,
    cross_levels,
    frozen_call,
    grad_reverse,
    level_batch_share,
    soft_level_batch_share,
)

if TYPE_CHECKING:  # the core takes any object with these fields; parsing lives elsewhere
    from locusformer.model.config import ModelConfig

# --------------------------------------------------------------------------------------
# From loci to tokens
# --------------------------------------------------------------------------------------


def sinusoidal_encoding(positions: Tensor, d_model: int) -> Tensor:
    """PE(pos, 2i) = sin(pos / 10000^(2i/d)), PE(pos, 2i+1) = cos(pos / 10000^(2i/d)).

    ``positions`` (T,) may be fractional (genomic coordinates); returns (T, d_model) fp32.
    """
    pos = positions.double()[:, None]  # (T, 1); fp64 so large coordinates keep digits
    i2 = torch.arange(0, d_model, 2, dtype=torch.float64, device=positions.device)  # 2i
    angle = pos / (10000.0 ** (i2 / d_model))  # (T, D/2)
    pe = torch.empty(len(positions), d_model, dtype=torch.float64, device=positions.device)
    pe[:, 0::2] = torch.sin(angle)
    pe[:, 1::2] = torch.cos(angle)
    return pe.float()


# chr1..chr22, chrX, chrY, chrM get their own index; everything else (unplaced loci,
# scaffolds, alt contigs) shares the last one.
CHROMOSOMES = [f"chr{i}" for i in range(1, 23)] + ["chrX", "chrY", "chrM"]
UNPLACED = len(CHROMOSOMES)
N_CHROMOSOME_CODES = UNPLACED + 1


def chromosome_code(name: object) -> int:
    """Index of a chromosome name ("chr1" or "1"); unplaced and other contigs -> UNPLACED."""
    if not isinstance(name, str) or not name:
        return UNPLACED
    name = name if name.startswith("chr") else f"chr{name}"
    name = {"chrMT": "chrM"}.get(name, name)
    return CHROMOSOMES.index(name) if name in CHROMOSOMES else UNPLACED


class LocusLayout(NamedTuple):
    """Where each locus sits in the token sequence.

    Loci are cut into runs of the same chromosome (in the given, genomic, order) and each
    run into patches of ``patch_size`` loci, so a token never straddles two chromosomes:
    its chromosome and position are well defined. The last patch of each run is padded.
    """

    token_index: Tensor  # (T, P) long: column of X for each slot; n_loci marks padding
    token_position: Tensor  # (T,) float: position fed to the sinusoidal encoding
    token_chrom: Tensor  # (T,) long: chromosome code
    n_loci: int  # L

    @property
    def n_tokens(self) -> int:
        return self.token_index.shape[0]

    @property
    def patch_size(self) -> int:
        return self.token_index.shape[1]


class LocusEmbedding(nn.Module):
    """Standardized expression (B, L) -> token vectors (B, T, D).

    A token is a patch of P consecutive loci. Its value embedding is
    sum_p x_p * (w_p + e_locus(p)) + b: a projection shared by all patches (w, b) plus,
    with ``locus_embedding="vector"``, a learned D-vector per locus that says how that
    gene's value enters the token (its identity). "affine" instead gives each locus a
    learned scale and bias applied to its value before the shared projection, "none"
    keeps only the shared projection (then the tokens know nothing of which genes they
    hold beyond position and chromosome). The token then gets its position
    (``positional_encoding``: the sinusoidal encoding of ``token_position``, or a learned
    vector per token index) and the embedding of its chromosome.
    """

    def __init__(self, config: ModelConfig, layout: LocusLayout):
        super().__init__()
        T, P = layout.token_index.shape
        D = config.d_model
        self.mode = config.locus_embedding
        self.register_buffer("token_index", layout.token_index.clone())  # (T, P)
        self.register_buffer("token_position", layout.token_position.clone())  # (T,)
        self.register_buffer("token_chrom", layout.token_chrom.clone())  # (T,)
        # Padding slots read a zero column appended to X; a zero value adds nothing.
        self.register_buffer("slot_valid", layout.token_index < layout.n_loci, persistent=False)
        self.patch_proj = nn.Linear(P, D)
        # Per-locus parameters live in (T, P) token layout so no scatter is needed in the
        # backward pass. They start at zero (= the shared projection alone), and weight
        # decay is not applied to them.
        self.locus_vector = nn.Parameter(torch.zeros(T, P, D)) if self.mode == "vector" else None
        self.locus_scale = nn.Parameter(torch.zeros(T, P)) if self.mode == "affine" else None
        self.locus_bias = nn.Parameter(torch.zeros(T, P)) if self.mode == "affine" else None
        self.chrom_embedding = (
            nn.Embedding(N_CHROMOSOME_CODES, D) if config.chromosome_embedding else None
        )
        position = config.positional_encoding  # old booleans: mapped by ModelConfig
        if position == "sinusoidal":
            pe = sinusoidal_encoding(layout.token_position, D)
            self.register_buffer("position_encoding", pe, persistent=False)  # (T, D)
        else:
            self.position_encoding = None
        if position == "learned":
            # By token index, whatever position_scale says: the layout fixes T. Small at
            # the start (as GPT-2's), so the tokens' values dominate early training; an
            # embedding, so the optimizer does not decay it (linear weights only).
            self.position_embedding = nn.Embedding(T, D)
            nn.init.normal_(self.position_embedding.weight, std=0.02)
        else:
            self.position_embedding = None

    def patchify(self, x: Tensor) -> Tensor:
        """(B, L) -> (B, T, P), padding slots 0 (the gene mean after standardization)."""
        x = F.pad(x, (0, 1))  # (B, L + 1): the extra column is the padding value
        return x[:, self.token_index]  # (B, T, P)

    def forward(self, x: Tensor) -> Tensor:
        patches = self.patchify(x)  # (B, T, P)
        if self.locus_scale is not None:
            patches = patches * (1.0 + self.locus_scale) + self.locus_bias
            patches = patches * self.slot_valid  # padding must carry no signal
        h = linear(patches, self.patch_proj)  # (B, T, D)
        if self.locus_vector is not None:
            h = h + torch.einsum("btp,tpd->btd", patches, self.locus_vector.to(h.dtype))
        if self.position_encoding is not None:
            h = h + self.position_encoding.to(h.dtype)
        if self.position_embedding is not None:
            h = h + self.position_embedding.weight.to(h.dtype)  # (T, D), token t's row t
        if self.chrom_embedding is not None:
            h = h + self.chrom_embedding(self.token_chrom)  # (T, D) broadcast over B
        return h


# --------------------------------------------------------------------------------------
# Encoder
# --------------------------------------------------------------------------------------


class FeedForward(nn.Module):
    def __init__(self, d_model: int, ratio: int, dropout: float):
        super().__init__()
        self.fc = nn.Linear(d_model, ratio * d_model)
        self.proj = nn.Linear(ratio * d_model, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(linear(linear(x, self.fc, gelu=True), self.proj))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(LN(x)), then x + mlp(LN(x)).

    Pre-norm keeps the residual stream an identity path, which trains stably without
    learning-rate tricks beyond a short warm-up.
    """

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.d_model)
        self.attn = MultiHeadSelfAttention(config.d_model, config.n_heads, config.attn_dropout)
        self.ln_2 = nn.LayerNorm(config.d_model)
        self.mlp = FeedForward(config.d_model, config.mlp_ratio, config.dropout)
        self.dropout = nn.Dropout(config.dropout)

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, Tensor | None]:
        a, weights = self.attn(
            self.ln_1(x), key_padding_mask=key_padding_mask, need_weights=need_weights
        )
        x = x + self.dropout(a)
        x = x + self.mlp(self.ln_2(x))
        return x, weights


class Encoder(nn.Module):
    """A stack of blocks and a final LayerNorm: (B, T, D) -> (B, T, D)."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(config.d_model)

    def forward(
        self, x: Tensor, key_padding_mask: Tensor | None = None, need_weights: bool = False
    ) -> tuple[Tensor, list[Tensor]]:
        all_weights = []
        for block in self.blocks:
            x, w = block(x, key_padding_mask, need_weights)
            if w is not None:
                all_weights.append(w)  # (B, H, T, T) per layer
        return self.ln_f(x), all_weights


def masked_mean(h: Tensor, key_padding_mask: Tensor | None, scaled: bool = False) -> Tensor:
    """Mean over tokens (B, T, D) -> (B, D), ignoring padded tokens (mask True = pad).

    ``scaled`` multiplies the mean by sqrt(number of tokens). A plain mean shrinks what
    any one token contributes by 1/T, and so (Adam's steps being of fixed size) slows the
    encoder's learning T-fold; a sample-specific signal spread over the tokens keeps unit
    scale under the sqrt. On simulated data this halved the epochs the encoder needed.
    """
    if key_padding_mask is None:
        count = torch.tensor(float(h.shape[1]), dtype=h.dtype, device=h.device)
        pooled = h.mean(dim=1)
    else:
        keep = (~key_padding_mask).to(h.dtype)[..., None]  # (B, T, 1)
        count = keep.sum(dim=1).clamp_min(1.0)  # (B, 1)
        pooled = (h * keep).sum(dim=1) / count
    return pooled * count.sqrt() if scaled else pooled


# --------------------------------------------------------------------------------------
# Batch-adversarial objective
# --------------------------------------------------------------------------------------


class BatchDiscriminator(nn.Module):
    """MLP latent (B, Z) -> batch logits (B, N)."""

    def __init__(self, latent_dim: int, hidden: int, n_batches: int):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(latent_dim, hidden),
            nn.GELU(),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, n_batches),
        )

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z)


# --------------------------------------------------------------------------------------
# Decoder
# --------------------------------------------------------------------------------------


class BatchConditionedDecoder(nn.Module):
    """(latent (B, Z), batch conditioning (B, N)) -> standardized expression (B, L).

    The conditioning is a one-hot batch vector, or any convex mix of them: correcting to
    the "mean" reference feeds 1/N everywhere. (A per-batch, per-locus output shift and
    scale on top, ComBat's model, made no measurable difference on simulated data.)
    """

    def __init__(self, latent_dim: int, n_batches: int, n_loci: int, hidden: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(latent_dim + n_batches, hidden),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(hidden, hidden),
            nn.GELU(),
            nn.Linear(hidden, n_loci),
        )

    def forward(self, z: Tensor, cond: Tensor) -> Tensor:
        first, _, dropout, second, _, last = self.net
        h = linear(torch.cat([z, cond.to(z.dtype)], dim=-1), first, gelu=True)  # (B, hidden)
        h = linear(dropout(h), second, gelu=True)  # (B, hidden)
        return linear(h, last)  # (B, L)


# --------------------------------------------------------------------------------------
# The whole model
# --------------------------------------------------------------------------------------


class BatchAdapter(nn.Module):
    """Parameters of batches a trained model never saw, learned with the model frozen.

    Per new batch and locus: a shift and a log-scale applied to the standardized input,
    ``(x - shift_in) * exp(-log_scale_in)``, which take the batch's effect out before
    the (frozen, batch-free) encoder; and a shift added to the decoder's output, which
    lets the reconstruction objective account for the batch's effect on the way out
    instead of forcing it into the latent. They start at zero: the adapter begins as
    the zero-shot mapping. Only these are trained (scArches' idea, Lotfollahi et al.
    2022: new conditions get new weights; the reference's weights do not move).
    """

    def __init__(self, n_new: int, n_loci: int):
        super().__init__()
        self.shift_in = nn.Parameter(torch.zeros(n_new, n_loci))
        self.log_scale_in = nn.Parameter(torch.zeros(n_new, n_loci))
        self.shift_out = nn.Parameter(torch.zeros(n_new, n_loci))

    def adapt(self, x: Tensor, new: Tensor) -> Tensor:
        """Standardized x (B, L) of new-batch codes ``new`` (B,) -> adapted input (B, L)."""
        return (x - self.shift_in[new]) * torch.exp(-self.log_scale_in[new])

    def output(self, recon: Tensor, new: Tensor) -> Tensor:
        """Decoder output (B, L) -> the new batch's reconstruction (B, L)."""
        return recon + self.shift_out[new]


class ModelOutput(NamedTuple):
    latent: Tensor  # (B, Z)
    recon: Tensor  # (B, L) standardized reconstruction given each sample's own batch
    # (B, N) discriminator logits, for the discriminator's own loss. "reversal": behind the
    # gradient reversal (the encoder gets -weight x their gradient); "confusion": on the
    # detached latent (the discriminator alone learns from them).
    batch_logits: Tensor
    # (B, N) "confusion" only: the same discriminator with its parameters frozen, on the
    # live latent; the encoder's confusion_loss is computed from these. None otherwise.
    confusion_logits: Tensor | None = None
    # (B, Z) the latent of the reconstruction decoded to another batch, re-encoded; only
    # when forward was given cycle batches.
    cycle_latent: Tensor | None = None


class LossWeights(NamedTuple):
    """What each term of :meth:`LocusFormer.loss` weighs at one point of the schedule."""

    confusion: float = 0.0  # on confusion_loss (ramp x adversary_weight)
    cycle: float = 0.0  # on the latent cycle-consistency (ramp x cycle_weight)
    batch_mean: float = 0.0  # on batch_mean_distance, before the ramp
    mmd: float = 0.0  # on batch_mmd, before the ramp
    level_mean: float = 0.0  # on level_batch_share (protected levels given)
    ramp: float = 1.0  # on the two batch-statistic terms


class Loss(NamedTuple):
    """The terms of the training objective (scalars) and ``total``, which is minimized.

    The history's ``train_*`` columns and the divergence message follow these fields.
    """

    recon: Tensor  # mean squared error of the reconstruction, standardized units
    adversary: Tensor  # the discriminator's cross-entropy (it minimizes this)
    confusion: Tensor  # the encoder's confusion term; 0 under "reversal"
    cycle: Tensor  # latent distance after decoding to another batch and re-encoding
    batch_mean: Tensor  # whitened distance between the batches' latent means
    mmd: Tensor  # MMD between each batch's latent and the others'
    level_mean: Tensor  # batch's share of the latent variance within protected levels
    total: Tensor


class LocusFormer(nn.Module):
    """Encoder over locus tokens -> latent -> batch-conditioned decoder over all loci.

    The model stores the per-gene mean and standard deviation of the training data
    (buffers, so they travel in the state dict) and works on standardized values inside;
    :meth:`standardize` / :meth:`unstandardize` convert. Batches are codes ``0..N-1``;
    their names, and everything else a trained model carries beside its weights, are in
    :class:`locusformer.train.checkpoint.ModelRecord`.
    """

    def __init__(self, config: ModelConfig, layout: LocusLayout, n_batches: int):
        super().__init__()
        if n_batches < 1:
            raise ValueError(f"need at least one batch, got {n_batches}")
        self.config = config
        self.n_loci = layout.n_loci
        self.n_batches = n_batches
        self.embed = LocusEmbedding(config, layout)
        self.encoder = Encoder(config)
        self.to_latent = nn.Linear(config.d_model, config.latent_dim)
        self.discriminator = BatchDiscriminator(
            config.latent_dim, config.discriminator_hidden, n_batches
        )
        self.decoder = BatchConditionedDecoder(
            config.latent_dim,
            n_batches,
            self.n_loci,
            config.decoder_hidden,
            config.dropout,
        )
        self.register_buffer("gene_mean", torch.zeros(self.n_loci))
        self.register_buffer("gene_std", torch.ones(self.n_loci))

    @property
    def n_tokens(self) -> int:
        return self.embed.token_index.shape[0]

    # -- standardization ---------------------------------------------------------------

    @torch.no_grad()
    def set_standardization(self, mean: Any, std: Any) -> None:
        """Store per-gene mean and std (tensors or arrays, (L,)); a (near) constant gene
        gets std 1, not 1/0."""
        mean = torch.as_tensor(mean, dtype=torch.float32)
        std = torch.as_tensor(std, dtype=torch.float32)
        std = torch.where(std > 1e-6, std, torch.ones_like(std))
        self.gene_mean.copy_(mean)
        self.gene_std.copy_(std)

    def standardize(self, x: Tensor) -> Tensor:
        return (x - self.gene_mean) / self.gene_std

    def unstandardize(self, x: Tensor) -> Tensor:
        return x * self.gene_std + self.gene_mean

    # -- the three parts -----------------------------------------------------------------

    def encode(self, x: Tensor, need_weights: bool = False) -> tuple[Tensor, list[Tensor]]:
        """Standardized x (B, L) -> latent (B, Z) and attention weights.

        The attention weights (one (B, H, T, T) tensor per layer) come only with
        ``need_weights``, which uses the explicit attention path. The encoder never sees
        the batch: the latent is meant to be free of it.
        """
        h = self.embed(x)  # (B, T, D)
        # Every token holds at least one real locus (padding is inside patches), so no
        # key padding mask is needed here.
        h, weights = self.encoder(h, need_weights=need_weights)  # (B, T, D)
        pooled = masked_mean(h, None, scaled=self.config.pooling == "scaled_mean")  # (B, D)
        return linear(pooled, self.to_latent), weights  # (B, Z)

    def decode(self, z: Tensor, cond: Tensor) -> Tensor:
        """Latent (B, Z) and batch conditioning (B, N) -> standardized expression (B, L)."""
        return self.decoder(z, cond)

    def condition(self, batch: Tensor) -> Tensor:
        """Batch codes (B,) -> one-hot conditioning (B, N)."""
        return F.one_hot(batch, self.n_batches).float()

    def reference_condition(self, code: int | None, n: int, device: torch.device) -> Tensor:
        """Conditioning (n, N) for batch ``code``, or all batches alike (``None``)."""
        if code is None:
            return torch.full((n, self.n_batches), 1.0 / self.n_batches, device=device)
        if not 0 <= code < self.n_batches:
            raise ValueError(f"batch code {code} out of range for {self.n_batches} batches")
        return self.condition(torch.full((n,), code, device=device))

    def forward(
        self,
        x: Tensor,
        batch: Tensor,
        adversary_weight: float = 0.0,
        adversary: str = "reversal",
        cycle_batch: Tensor | None = None,
    ) -> ModelOutput:
        """Standardized x (B, L) and batch codes (B,) -> latent, reconstruction, logits.

        ``adversary`` is "reversal" (the discriminator's gradient reaches the encoder
        reversed and scaled by ``adversary_weight``) or "confusion" (:meth:`loss` weighs
        :func:`confusion_loss` of ``confusion_logits``; ``adversary_weight`` is unused).
        ``cycle_batch`` (B,), when given, are batches to decode each sample to and encode
        again (``cycle_latent``): the same cell seen through another batch should keep its
        latent (sysVI's latent cycle-consistency, Hrovatin et al. 2024). Unlike matching
        the batches' distributions, this asks nothing of their composition.
        """
        z, _ = self.encode(x)
        recon = self.decode(z, self.condition(batch))
        cycle = None
        if cycle_batch is not None:
            cycle, _ = self.encode(self.decode(z, self.condition(cycle_batch)))
        if adversary == "confusion":
            logits = self.discriminator(z.detach())
            return ModelOutput(z, recon, logits, frozen_call(self.discriminator, z), cycle)
        logits = self.discriminator(grad_reverse(z, adversary_weight))
        return ModelOutput(z, recon, logits, None, cycle)

    def loss(
        self,
        x: Tensor,
        batch: Tensor,
        out: ModelOutput,
        weights: LossWeights,
        prior: Tensor | None = None,
        *,
        share: float = 1.0,
        stats: tuple[Tensor, Tensor, Tensor | None, Tensor | None] | None = None,
        clusters: Clusters | None = None,
        levels: Tensor | None = None,
        level_weights: Tensor | None = None,
    ) -> Loss:
        """The training objective of :meth:`forward`'s ``out`` on standardized ``x`` (B, L).

        The discriminator minimizes its cross-entropy at full strength. Under "reversal"
        the encoder receives -weight times that gradient through ``out``; under
        "confusion" the encoder's term is ``weights.confusion`` x :func:`confusion_loss`
        against ``prior``: (N,) the batch frequencies, or (B, N) a target per sample
        (:mod:`locusformer.train.alignment`), whose samples with their own batch alone as target
        the batch means leave out. The batch-statistic terms need a whole minibatch:
        ``stats`` = (latent (M, Z), batch codes (M,), targets (M, N) or None, protected levels
        (M,) or None) of all of it when this process holds a share only (DDP), whose
        per-sample terms then weigh
        ``share`` (its rows x processes / M), so that averaging the processes' gradients
        gives the gradient of the whole minibatch's loss. ``clusters``, when given, moves
        the batch means into the latent's clusters (:func:`cluster_batch_mean_distance`),
        each sample weighed there by its :func:`cluster_cover` when ``clusters.cover``.
        ``levels`` (B,), each sample's protected level, adds :func:`level_batch_share` at
        ``weights.level_mean``; with ``level_weights`` (B, L) (M with ``stats``), each
        sample's share in soft levels, :func:`soft_level_batch_share` on those instead.
        """
        recon = F.mse_loss(out.recon.float(), x)
        adversary = F.cross_entropy(out.batch_logits.float(), batch)
        if out.confusion_logits is None or prior is None:
            confusion = torch.zeros((), device=out.latent.device)
        else:
            confusion = confusion_loss(out.confusion_logits, prior)
        z, b, targets, levels = stats if stats is not None else (out.latent, batch, prior, levels)
        shared = None
        if targets is not None and targets.dim() == 2:
            # Per-sample targets: a sample whose target is its own batch alone holds
            # biology no other batch has, and the batch means leave it out.
            shared = (targets.max(dim=-1).values < 1.0).float()
        if clusters is None:
            batch_mean = batch_mean_distance(z, b, self.n_batches, weight=shared)
        else:
            resp = cluster_responsibilities(z, clusters)  # (M, K)
            if clusters.levels:
                resp = cross_levels(resp, levels, clusters.levels)  # (M, K * L)
            if shared is not None:
                resp = resp * shared[:, None]
            if clusters.cover:
                resp = resp * cluster_cover(resp, clusters.gate, b, self.n_batches)
            batch_mean = cluster_batch_mean_distance(z, b, self.n_batches, resp, clusters.gate)
        mmd = batch_mmd(z, b, self.n_batches)
        cycle = torch.zeros((), device=out.latent.device)
        if out.cycle_latent is not None:
            # Scale-free, so the encoder cannot meet it by shrinking the latent.
            scale = out.latent.detach().float().var(dim=0).sum().clamp_min(1e-8)
            cycle = (out.cycle_latent.float() - out.latent.float()).pow(2).sum(-1).mean() / scale
        per_sample = recon + adversary + weights.confusion * confusion
        if weights.cycle:
            per_sample = per_sample + weights.cycle * cycle
        if share != 1.0:
            per_sample = share * per_sample
        level_mean = torch.zeros((), device=out.latent.device)
        if levels is not None:
            # Protected levels: the batch's share of the latent's variance within each.
            level_mean = (
                level_batch_share(z, b, levels, self.n_batches)
                if level_weights is None
                else soft_level_batch_share(z, b, level_weights, self.n_batches)
            )
        total = per_sample + weights.ramp * (weights.batch_mean * batch_mean + weights.mmd * mmd)
        if levels is not None and weights.level_mean:
            total = total + weights.level_mean * level_mean
        return Loss(
            recon=recon,
            adversary=adversary,
            confusion=confusion,
            cycle=cycle,
            batch_mean=batch_mean,
            mmd=mmd,
            level_mean=level_mean,
            total=total,
        )

    # -- (de)serialization ---------------------------------------------------------------

    @classmethod
    def from_state_dict(
        cls, config: ModelConfig, state_dict: Mapping[str, Tensor], n_batches: int
    ) -> LocusFormer:
        """Rebuild a model whose layout is read from the state dict's buffers."""
        layout = LocusLayout(
            token_index=state_dict["embed.token_index"],
            token_position=state_dict["embed.token_position"],
            token_chrom=state_dict["embed.token_chrom"],
            n_loci=state_dict["gene_mean"].shape[0],
        )
        model = cls(config, layout, n_batches)
        model.load_state_dict(state_dict)
        return model
