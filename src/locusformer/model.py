"""The LocusFormer model: self-attention over gene loci in genomic order.

Read top to bottom:

1. ``ModelConfig`` - every knob of the architecture, with the defaults we measured.
2. ``linear`` - the one place a linear layer runs, fused with its GELU on the CPU.
3. ``MultiHeadSelfAttention`` - one module, one set of weights, two paths: an explicit,
   readable path that can return attention weights and a fused path
   (``scaled_dot_product_attention``) used for training.
4. ``sinusoidal_encoding`` / ``LocusLayout`` / ``LocusEmbedding`` - how a row of the
   expression matrix becomes a sequence of tokens (patches of consecutive loci).
5. ``Block`` / ``Encoder`` / ``masked_mean`` - pre-norm transformer blocks, pooling.
6. ``GradientReversal`` / ``BatchDiscriminator`` / ``batch_mean_distance`` /
   ``batch_mmd`` - the terms that push batch information out of the latent.
7. ``BatchConditionedDecoder`` - reconstructs every locus from (latent, batch).
8. ``LocusFormer`` - ties it together and owns the per-gene standardization.

Shapes in comments: B batch of samples, L loci, T tokens, P loci per token (patch size),
D model width, H heads, K = D // H head width, Z latent width, N number of batches.
"""

from __future__ import annotations

import dataclasses
import math
import platform
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from locusformer.errors import InputError

# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


def config_from_dict(cls: type, data: Mapping[str, Any] | None, source: str) -> Any:
    """Build dataclass ``cls`` from a mapping of overrides.

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


@dataclass
class ModelConfig:
    """Architecture of a :class:`LocusFormer`.

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
    pooling: str = "scaled_mean"  # "mean" or "scaled_mean" (mean x sqrt(tokens))
    dropout: float = 0.1  # on the residual branches, feed-forward and decoder
    # On attention weights. Off: with it, CPU's fused attention falls back to the math
    # kernel and draws a T x T mask (measured 16x slower at 500 tokens).
    attn_dropout: float = 0.0
    mlp_ratio: int = 4  # width of the feed-forward layer, in multiples of d_model
    position_scale: str = "rank"  # "rank" (token index) or "coordinate" (genomic start)
    coordinate_unit: float = 1e6  # base pairs per unit of position when "coordinate"
    positional_encoding: bool = True  # sinusoidal encoding of the token's position
    chromosome_embedding: bool = True  # learned embedding of the token's chromosome
    locus_embedding: str = "vector"  # locus identity: "vector", "affine" or "none"
    decoder_hidden: int = 256
    discriminator_hidden: int = 64

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> ModelConfig:
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
        if self.position_scale not in ("rank", "coordinate"):
            raise InputError(
                f"{source}.position_scale",
                f"must be 'rank' or 'coordinate', got {self.position_scale!r}",
            )
        if self.locus_embedding not in ("vector", "affine", "none"):
            raise InputError(
                f"{source}.locus_embedding",
                f"must be 'vector', 'affine' or 'none', got {self.locus_embedding!r}",
            )
        if self.pooling not in ("mean", "scaled_mean"):
            raise InputError(
                f"{source}.pooling", f"must be 'mean' or 'scaled_mean', got {self.pooling!r}"
            )
        if self.coordinate_unit <= 0:
            raise InputError(f"{source}.coordinate_unit", "must be > 0")


# --------------------------------------------------------------------------------------
# Attention
# --------------------------------------------------------------------------------------


def stable_softmax(scores: Tensor) -> Tensor:
    """Softmax over the last axis that never overflows and never returns NaN.

    Subtracting the row maximum keeps ``exp`` <= 1 even for logits of 1e4 in fp16/bf16.
    The sum is taken in fp32 because a bf16 sum of thousands of terms loses digits.
    A row whose every entry is -inf (every key masked) gets all-zero weights, not NaN.
    """
    s = scores.float()
    row_max = s.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max))
    e = torch.exp(s - row_max)  # masked (-inf) entries become exactly 0
    denom = e.sum(dim=-1, keepdim=True)
    return (e / denom.clamp_min(torch.finfo(torch.float32).tiny)).to(scores.dtype)


def merge_masks(
    key_padding_mask: Tensor | None,
    attn_mask: Tensor | None,
    batch: int,
    heads: int,
    dtype: torch.dtype,
) -> Tensor | None:
    """Combine the two optional masks into one additive mask of shape (B|1, H|1, T, S).

    Conventions follow ``torch.nn.MultiheadAttention``: a boolean ``True`` means "may not
    attend"; a float mask is added to the logits. ``key_padding_mask`` is (B, S);
    ``attn_mask`` is (T, S), (B*H, T, S) or (B, H, T, S).
    """
    mask = None
    if attn_mask is not None:
        m = _additive(attn_mask, dtype)
        if m.dim() == 3:  # (B*H, T, S) as nn.MultiheadAttention takes it
            m = m.view(batch, heads, *m.shape[-2:])
        mask = m
    if key_padding_mask is not None:
        m = _additive(key_padding_mask, dtype)[:, None, None, :]  # (B, 1, 1, S)
        mask = m if mask is None else mask + m
    return mask


def _additive(mask: Tensor, dtype: torch.dtype) -> Tensor:
    if mask.dtype == torch.bool:
        zeros = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
        return zeros.masked_fill(mask, float("-inf"))
    return mask.to(dtype)


# --------------------------------------------------------------------------------------
# Linear layers
# --------------------------------------------------------------------------------------


def _onednn_available() -> bool:
    # x86-64 only: that is where it was measured. Elsewhere PyTorch's matmul may call a
    # faster library (Apple's Accelerate, Arm's) than oneDNN's kernels there.
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        return torch.backends.mkldnn.is_available() and bool(torch.ops.mkldnn._linear_pointwise)
    except (AttributeError, RuntimeError):
        return False


#: Whether fp32 inference on an x86-64 CPU runs linear layers through oneDNN (see
#: :func:`linear`). Off, every path is plain ``F.linear``; the benchmarks turn it off to
#: count FLOPs.
ONEDNN = _onednn_available()


def linear(x: Tensor, layer: nn.Linear, gelu: bool = False) -> Tensor:
    """``layer(x)``, followed by exact GELU when ``gelu``: (..., in) -> (..., out).

    In fp32 on an x86-64 CPU with autograd off (``correct``), this calls oneDNN's linear
    kernel with the GELU fused into it. PyTorch's own fp32 CPU matmul calls MKL, which on
    the project's AMD (Zen) machines ran at 0.45 of oneDNN's rate on a 2048 x 2048
    product; the fused GELU also saves a pass over the feed-forward activations.
    ``correct``'s model ran 1.3-1.4x as fast (BENCHMARKS.md, "Scaling"). The result
    equals the plain path's to float32 rounding. Training and ``torch.compile`` keep the
    plain path: PyTorch gives the backward of that one, and inductor fuses it on its own.
    """
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or layer.weight.requires_grad)
    if (
        ONEDNN
        and x.device.type == "cpu"
        and x.dtype == torch.float32
        and not needs_grad
        and not torch.compiler.is_compiling()
    ):
        kind = "gelu" if gelu else "none"
        return torch.ops.mkldnn._linear_pointwise(
            x, layer.weight, layer.bias, kind, [], "none" if gelu else ""
        )
    y = F.linear(x, layer.weight, layer.bias)
    return F.gelu(y) if gelu else y


class MultiHeadSelfAttention(nn.Module):
    """Multi-head self-attention with an explicit and a fused path over one set of weights.

    The fused in-projection ``in_proj`` stacks the Q, K and V projections in the same
    layout as ``nn.MultiheadAttention.in_proj_weight``, so weights copy over one to one
    (:meth:`load_from_torch`).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.fused = True  # default path when no attention weights are asked for
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        fused: bool | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend ``x`` (B, T, D) to itself.

        Returns the output (B, T, D) and, when ``need_weights`` (which forces the explicit
        path), the attention weights (B, H, T, T); otherwise ``None``.
        """
        B, T, D = x.shape
        q, k, v = linear(x, self.in_proj).split(D, dim=-1)  # 3 x (B, T, D)
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        # q, k, v: (B, H, T, K)
        mask = merge_masks(key_padding_mask, attn_mask, B, self.n_heads, q.dtype)
        use_fused = (self.fused if fused is None else fused) and not need_weights
        if use_fused:
            y, weights = self._fused(q, k, v, mask), None
        else:
            y, weights = self._explicit(q, k, v, mask)
        y = y.transpose(1, 2).reshape(B, T, D)  # (B, T, D): heads side by side
        return linear(y, self.out_proj), weights

    def _explicit(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """softmax(Q K^T / sqrt(K) + mask) V, written out so the weights can be returned."""
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, H, T, T)
        if mask is not None:
            scores = scores + mask  # -inf where a key is masked
        weights = stable_softmax(scores)  # (B, H, T, T), masked keys exactly 0
        dropped = F.dropout(weights, self.dropout, self.training)
        return dropped @ v, weights  # (B, H, T, K)

    def _fused(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
        """The same computation through PyTorch's fused kernel (flash / memory-efficient)."""
        empty_rows = None
        if mask is not None:
            # Backends disagree on rows where every key is masked (some give NaN, also in
            # the backward pass). Let such rows attend freely, then zero their output,
            # which is what the explicit path computes.
            empty_rows = torch.isneginf(mask).all(dim=-1, keepdim=True)  # (B|1, H|1, T, 1)
            if bool(empty_rows.any()):
                mask = mask.masked_fill(empty_rows, 0.0)
            else:
                empty_rows = None
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )  # (B, H, T, K)
        if empty_rows is not None:
            y = y.masked_fill(empty_rows, 0.0)
        return y

    @torch.no_grad()
    def load_from_torch(self, mha: nn.MultiheadAttention) -> None:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` with the same width."""
        if mha.in_proj_weight is None:
            raise ValueError("only nn.MultiheadAttention with equal q/k/v widths is supported")
        self.in_proj.weight.copy_(mha.in_proj_weight)
        self.out_proj.weight.copy_(mha.out_proj.weight)
        if self.in_proj.bias is not None:
            self.in_proj.bias.copy_(mha.in_proj_bias)
            self.out_proj.bias.copy_(mha.out_proj.bias)


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


def build_layout(
    loci: pd.DataFrame, patch_size: int, position_scale: str = "rank", coordinate_unit: float = 1e6
) -> LocusLayout:
    """Cut the loci table (one row per column of X, in genomic order) into tokens.

    ``position_scale="rank"`` uses the token index; ``"coordinate"`` the mean genomic start
    of the token's loci in units of ``coordinate_unit`` (per chromosome, as the chromosome
    embedding tells chromosomes apart). Tokens without coordinates (unplaced loci) use
    their index within their run.
    """
    if "chrom" not in loci.columns:
        raise InputError("loci table", "missing column 'chrom'")
    if position_scale == "coordinate" and "start" not in loci.columns:
        raise InputError("loci table", "missing column 'start' (needed for coordinate positions)")
    n = len(loci)
    if n == 0:
        raise InputError("loci table", "has no rows")
    codes = np.array([chromosome_code(c) for c in loci["chrom"].tolist()], dtype=np.int64)
    if "start" in loci.columns:
        start = pd.to_numeric(loci["start"], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
    else:
        start = np.full(n, np.nan)
    if "placed" in loci.columns:
        start = np.where(loci["placed"].fillna(False).to_numpy(dtype=bool), start, np.nan)

    run_starts = np.flatnonzero(np.r_[True, codes[1:] != codes[:-1]])
    run_ends = np.r_[run_starts[1:], n]
    index, position, chrom = [], [], []
    for a, b in zip(run_starts, run_ends, strict=True):
        for j, p in enumerate(range(a, b, patch_size)):
            slots = np.arange(p, p + patch_size)
            slots[slots >= b] = n  # padding slot
            index.append(slots)
            chrom.append(codes[a])
            real = slots[slots < n]
            if position_scale == "rank":
                position.append(float(len(position)))
            elif np.isfinite(start[real]).any():
                position.append(float(np.nanmean(start[real])) / coordinate_unit)
            else:
                position.append(float(j))
    return LocusLayout(
        token_index=torch.as_tensor(np.stack(index), dtype=torch.long),
        token_position=torch.as_tensor(position, dtype=torch.float32),
        token_chrom=torch.as_tensor(chrom, dtype=torch.long),
        n_loci=n,
    )


class LocusEmbedding(nn.Module):
    """Standardized expression (B, L) -> token vectors (B, T, D).

    A token is a patch of P consecutive loci. Its value embedding is
    sum_p x_p * (w_p + e_locus(p)) + b: a projection shared by all patches (w, b) plus,
    with ``locus_embedding="vector"``, a learned D-vector per locus that says how that
    gene's value enters the token (its identity). "affine" instead gives each locus a
    learned scale and bias applied to its value before the shared projection, "none"
    keeps only the shared projection (then the tokens know nothing of which genes they
    hold beyond position and chromosome). The token then gets the sinusoidal encoding of
    its position and the embedding of its chromosome.
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
        if config.positional_encoding:
            pe = sinusoidal_encoding(layout.token_position, D)
            self.register_buffer("position_encoding", pe, persistent=False)  # (T, D)
        else:
            self.position_encoding = None

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


class GradientReversal(torch.autograd.Function):
    """Identity forward; multiplies the gradient by -weight backward.

    The discriminator behind it learns to predict the batch at full strength while the
    encoder is pushed, with strength ``weight``, to make that impossible.
    """

    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: float) -> Tensor:
        ctx.weight = weight
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        return -ctx.weight * grad, None


def grad_reverse(x: Tensor, weight: float) -> Tensor:
    return GradientReversal.apply(x, weight)


def frozen_call(module: nn.Module, x: Tensor) -> Tensor:
    """``module(x)`` with the gradient flowing into ``x`` only, not into the parameters."""
    params = {name: p.detach() for name, p in module.named_parameters()}
    return torch.func.functional_call(module, params, (x,))


def confusion_loss(logits: Tensor, prior: Tensor) -> Tensor:
    """Cross-entropy of discriminator logits (B, N) against the batch prior (N,).

    The encoder's adversarial objective in "confusion" mode: the latent should leave the
    discriminator no better than the batch frequencies. Unlike maximizing the
    discriminator's error (gradient reversal), which drives a cell toward wherever the
    discriminator is surest of *another* batch, this drives it toward where the
    discriminator is unsure. That matters when batches hold different cell types: a
    cell type present in some batches only is a region the discriminator is sure about,
    and reversal pulls the other batches' cells into it.
    """
    return -(prior.to(logits.dtype) * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


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


def batch_mean_distance(z: Tensor, batch: Tensor, n_batches: int, ridge: float = 1e-2) -> Tensor:
    """Between-batch spread of the latent means, whitened by the within-batch covariance.

    sum_b (n_b / n) (mu_b - mu)^T (S_w + ridge * tr(S_w)/Z * I)^-1 (mu_b - mu): the
    Fisher ratio a linear classifier of the batch would exploit. Whitening makes it
    scale-free, so batch information cannot hide in a low-variance direction, and being
    quadratic it does not saturate (a confident discriminator passes back almost no
    gradient; this term does). 0 when one batch only is present. Like ``batch_mmd`` it
    has no data-dependent branches, so it never waits on the GPU.
    """
    z = z.float()
    n, Z = z.shape
    onehot = F.one_hot(batch, n_batches).float()  # (B, N)
    counts = onehot.sum(dim=0)  # (N,)
    means = (onehot.T @ z) / counts.clamp_min(1.0)[:, None]  # (N, Z); 0 for absent batches
    centered = z - means[batch]  # (B, Z) within-batch deviations
    dof = (n - (counts > 0).sum()).clamp_min(1)
    s_w = centered.T @ centered / dof  # (Z, Z)
    s_w = s_w + ridge * (s_w.trace() / Z + 1e-8) * torch.eye(Z, device=z.device)
    d = means - z.mean(dim=0)  # (N, Z)
    solved = torch.linalg.solve(s_w, d.T).T  # (N, Z) = S_w^-1 d
    return ((counts / n)[:, None] * d * solved).sum()  # absent batches weigh 0


def batch_mmd(z: Tensor, batch: Tensor, n_batches: int) -> Tensor:
    """Mean over batches of MMD^2(latent of batch b, latent of all other batches).

    Gaussian kernels at several bandwidths around the mean squared distance, so the term
    does not depend on the scale of the latent. Batches absent from (or alone in) the
    minibatch count for nothing.
    """
    z = z.float()
    d2 = torch.cdist(z, z).pow(2)  # (B, B)
    scale = d2.detach().mean().clamp_min(1e-8)
    kernel = sum(torch.exp(-d2 / (scale * s)) for s in (0.25, 1.0, 4.0))  # (B, B)
    inside = F.one_hot(batch, n_batches).float()  # (B, N)
    outside = 1.0 - inside
    n_in, n_out = inside.sum(dim=0), outside.sum(dim=0)  # (N,)
    k_in = (inside * (kernel @ inside)).sum(dim=0) / n_in.clamp_min(1.0) ** 2
    k_out = (outside * (kernel @ outside)).sum(dim=0) / n_out.clamp_min(1.0) ** 2
    k_cross = (inside * (kernel @ outside)).sum(dim=0) / (n_in * n_out).clamp_min(1.0)
    valid = ((n_in > 0) & (n_out > 0)).float()  # (N,)
    return ((k_in + k_out - 2 * k_cross) * valid).sum() / valid.sum().clamp_min(1.0)


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


class LocusFormer(nn.Module):
    """Encoder over locus tokens -> latent -> batch-conditioned decoder over all loci.

    The model stores the per-gene mean and standard deviation of the training data
    (buffers, so they travel in the state dict) and works on standardized values inside;
    :meth:`standardize` / :meth:`unstandardize` convert.
    """

    def __init__(
        self,
        config: ModelConfig,
        layout: LocusLayout,
        batch_names: Sequence[str],
        gene_ids: Sequence[str] | None = None,
    ):
        super().__init__()
        self.config = config
        self.n_loci = layout.n_loci
        self.batch_names = [str(b) for b in batch_names]
        if len(set(self.batch_names)) != len(self.batch_names):
            raise ValueError("batch names must be unique")
        self.gene_ids = None if gene_ids is None else [str(g) for g in gene_ids]
        if self.gene_ids is not None and len(self.gene_ids) != self.n_loci:
            raise ValueError(f"{len(self.gene_ids)} gene ids for {self.n_loci} loci")
        self.embed = LocusEmbedding(config, layout)
        self.encoder = Encoder(config)
        self.to_latent = nn.Linear(config.d_model, config.latent_dim)
        self.discriminator = BatchDiscriminator(
            config.latent_dim, config.discriminator_hidden, self.n_batches
        )
        self.decoder = BatchConditionedDecoder(
            config.latent_dim,
            self.n_batches,
            self.n_loci,
            config.decoder_hidden,
            config.dropout,
        )
        self.register_buffer("gene_mean", torch.zeros(self.n_loci))
        self.register_buffer("gene_std", torch.ones(self.n_loci))

    @property
    def n_batches(self) -> int:
        return len(self.batch_names)

    @property
    def n_tokens(self) -> int:
        return self.embed.token_index.shape[0]

    # -- standardization ---------------------------------------------------------------

    @torch.no_grad()
    def set_standardization(self, mean: Tensor | np.ndarray, std: Tensor | np.ndarray) -> None:
        """Store per-gene mean and std; a (near) constant gene gets std 1, not 1/0."""
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

    def reference_condition(self, reference: str, n: int, device: torch.device) -> Tensor:
        """Conditioning (n, N) for a named reference batch or "mean" (all batches alike)."""
        if reference == "mean":
            return torch.full((n, self.n_batches), 1.0 / self.n_batches, device=device)
        if reference not in self.batch_names:
            valid = ", ".join(["mean", *self.batch_names])
            raise InputError("reference", f"unknown batch {reference!r} (valid: {valid})")
        code = torch.full((n,), self.batch_names.index(reference), device=device)
        return self.condition(code)

    def forward(
        self,
        x: Tensor,
        batch: Tensor,
        adversary_weight: float = 0.0,
        adversary: str = "reversal",
    ) -> ModelOutput:
        """Standardized x (B, L) and batch codes (B,) -> latent, reconstruction, logits.

        ``adversary`` is "reversal" (the discriminator's gradient reaches the encoder
        reversed and scaled by ``adversary_weight``) or "confusion" (the caller weighs
        :func:`confusion_loss` of ``confusion_logits``; ``adversary_weight`` is unused).
        """
        z, _ = self.encode(x)
        recon = self.decode(z, self.condition(batch))
        if adversary == "confusion":
            logits = self.discriminator(z.detach())
            return ModelOutput(z, recon, logits, frozen_call(self.discriminator, z))
        logits = self.discriminator(grad_reverse(z, adversary_weight))
        return ModelOutput(z, recon, logits)

    # -- (de)serialization helpers -------------------------------------------------------

    @classmethod
    def from_state_dict(
        cls,
        config: ModelConfig,
        state_dict: Mapping[str, Tensor],
        batch_names: Sequence[str],
        gene_ids: Sequence[str] | None = None,
    ) -> LocusFormer:
        """Rebuild a model whose layout is read from the state dict's buffers."""
        layout = LocusLayout(
            token_index=state_dict["embed.token_index"],
            token_position=state_dict["embed.token_position"],
            token_chrom=state_dict["embed.token_chrom"],
            n_loci=state_dict["gene_mean"].shape[0],
        )
        model = cls(config, layout, batch_names, gene_ids)
        model.load_state_dict(state_dict)
        return model
