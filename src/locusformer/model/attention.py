"""The attention layers and the linear layers they and the model run on.

The tutorial's attention family, each with one set of weights and two paths: an explicit,
readable path that can return attention weights and a fused path
(``scaled_dot_product_attention``) used for training and correction.

- ``MultiHeadSelfAttention``: a sequence attends to itself. The model's encoder uses it.
- ``MultiHeadCrossAttention``: queries from one sequence, keys and values from another
  (of another length, and width). The model does not use it: a sample's tokens have no
  second sequence to attend to. It is a tested part of the library.
- Causal masking (``is_causal=True`` on either): query i sees keys 0..i only. The model
  does not use it either: genomic order has no direction, so no token should be blind to
  the loci after it. Tested like the rest.

Masks follow ``torch.nn.MultiheadAttention``'s conventions, and the tests check every path
against it (outputs and weights). ``linear`` is the one place a linear layer runs (oneDNN
with a fused GELU for fp32 CPU inference on x86-64). Torch and the standard library only.

Shapes: B batch, T tokens (queries), S keys, D model width, H heads, K = D // H.
"""

from __future__ import annotations

import math
import platform

import torch
import torch.nn.functional as F
from torch import Tensor, nn


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


def causal_mask(n_queries: int, n_keys: int, device: torch.device | None = None) -> Tensor:
    """(T, S) boolean mask, ``True`` where query i may not attend key j, that is j > i.

    Aligned at the top left, as ``scaled_dot_product_attention(is_causal=True)`` aligns
    it: with fewer keys than queries, the last queries see every key.
    """
    return torch.ones(n_queries, n_keys, dtype=torch.bool, device=device).triu(1)


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
    ``correct``'s model ran 1.3-1.4x as fast (issue 15). The result
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


class _Attention(nn.Module):
    """What the attention layers share: heads, masks, the two paths, the out-projection.

    A subclass creates its in-projections, then ``out_proj`` (D -> D), in that order: it
    is the order in which the seeded initialization draws them. It projects its input(s)
    to per-head queries, keys and values and hands them to :meth:`_attend`.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        if d_model % n_heads:
            raise ValueError(f"d_model={d_model} is not divisible by n_heads={n_heads}")
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.fused = True  # default path when no attention weights are asked for

    def _heads(self, t: Tensor) -> Tensor:
        """(B, N, D) -> (B, H, N, K)."""
        return t.view(t.shape[0], t.shape[1], self.n_heads, self.head_dim).transpose(1, 2)

    def _attend(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        *,
        key_padding_mask: Tensor | None,
        attn_mask: Tensor | None,
        is_causal: bool,
        need_weights: bool,
        fused: bool | None,
    ) -> tuple[Tensor, Tensor | None]:
        """q (B, H, T, K), k and v (B, H, S, K) -> output (B, T, D), weights (B, H, T, S)."""
        B, _, T, _ = q.shape
        mask = merge_masks(key_padding_mask, attn_mask, B, self.n_heads, q.dtype)
        use_fused = (self.fused if fused is None else fused) and not need_weights
        # Without another mask the fused kernel takes causality as a flag (no T x S mask
        # drawn); otherwise it joins the additive mask.
        causal_flag = is_causal and use_fused and mask is None
        if is_causal and not causal_flag:
            causal = _additive(causal_mask(T, k.shape[-2], q.device), q.dtype)
            mask = causal if mask is None else mask + causal
        if use_fused:
            y, weights = self._fused(q, k, v, mask, causal_flag), None
        else:
            y, weights = self._explicit(q, k, v, mask)
        y = y.transpose(1, 2).reshape(B, T, -1)  # (B, T, D): heads side by side
        return linear(y, self.out_proj), weights

    def _explicit(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None
    ) -> tuple[Tensor, Tensor]:
        """softmax(Q K^T / sqrt(K) + mask) V, written out so the weights can be returned."""
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)  # (B, H, T, S)
        if mask is not None:
            scores = scores + mask  # -inf where a key is masked
        weights = stable_softmax(scores)  # (B, H, T, S), masked keys exactly 0
        dropped = F.dropout(weights, self.dropout, self.training)
        return dropped @ v, weights  # (B, H, T, K)

    def _fused(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool = False
    ) -> Tensor:
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
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=is_causal,
        )  # (B, H, T, K)
        if empty_rows is not None:
            y = y.masked_fill(empty_rows, 0.0)
        return y


class MultiHeadSelfAttention(_Attention):
    """Multi-head self-attention with an explicit and a fused path over one set of weights.

    The fused in-projection ``in_proj`` stacks the Q, K and V projections in the same
    layout as ``nn.MultiheadAttention.in_proj_weight``, so weights copy over one to one
    (:meth:`load_from_torch`).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__(d_model, n_heads, dropout)
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        fused: bool | None = None,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend ``x`` (B, T, D) to itself (token i to tokens 0..i when ``is_causal``).

        Returns the output (B, T, D) and, when ``need_weights`` (which forces the explicit
        path), the attention weights (B, H, T, T); otherwise ``None``.
        """
        D = x.shape[-1]
        q, k, v = (self._heads(t) for t in linear(x, self.in_proj).split(D, dim=-1))
        # q, k, v: (B, H, T, K)
        return self._attend(
            q,
            k,
            v,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            is_causal=is_causal,
            need_weights=need_weights,
            fused=fused,
        )

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


class MultiHeadCrossAttention(_Attention):
    """Queries from ``x`` (B, T, D), keys and values from ``context`` (B, S, C).

    ``q_proj`` maps D -> D and ``kv_proj`` stacks the K and V projections C -> 2D, in the
    order of ``nn.MultiheadAttention``'s weights (:meth:`load_from_torch`). ``context_dim``
    C defaults to D (``nn.MultiheadAttention``'s ``kdim == vdim``). Not used by the model
    (see the module's docstring).
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        context_dim: int | None = None,
    ):
        super().__init__(d_model, n_heads, dropout)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias)
        self.kv_proj = nn.Linear(context_dim or d_model, 2 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(
        self,
        x: Tensor,
        context: Tensor,
        key_padding_mask: Tensor | None = None,
        attn_mask: Tensor | None = None,
        need_weights: bool = False,
        fused: bool | None = None,
        is_causal: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Attend each token of ``x`` (B, T, D) to the tokens of ``context`` (B, S, C).

        ``key_padding_mask`` (B, S) marks context tokens to ignore; ``attn_mask`` is
        (T, S), (B*H, T, S) or (B, H, T, S); ``is_causal`` lets query i see keys 0..i.
        Returns the output (B, T, D) and, with ``need_weights``, the weights (B, H, T, S).
        """
        D = x.shape[-1]
        q = self._heads(linear(x, self.q_proj))  # (B, H, T, K)
        k, v = (self._heads(t) for t in linear(context, self.kv_proj).split(D, dim=-1))
        # k, v: (B, H, S, K)
        return self._attend(
            q,
            k,
            v,
            key_padding_mask=key_padding_mask,
            attn_mask=attn_mask,
            is_causal=is_causal,
            need_weights=need_weights,
            fused=fused,
        )

    @torch.no_grad()
    def load_from_torch(self, mha: nn.MultiheadAttention) -> None:
        """Copy the weights of a ``torch.nn.MultiheadAttention`` (``kdim == vdim``)."""
        D = self.out_proj.in_features
        if mha.in_proj_weight is not None:
            q_weight, kv_weight = mha.in_proj_weight[:D], mha.in_proj_weight[D:]
        elif mha.kdim == mha.vdim:
            q_weight = mha.q_proj_weight
            kv_weight = torch.cat([mha.k_proj_weight, mha.v_proj_weight])
        else:
            raise ValueError("only nn.MultiheadAttention with kdim == vdim is supported")
        self.q_proj.weight.copy_(q_weight)
        self.kv_proj.weight.copy_(kv_weight)
        self.out_proj.weight.copy_(mha.out_proj.weight)
        if self.q_proj.bias is not None:
            self.q_proj.bias.copy_(mha.in_proj_bias[:D])
            self.kv_proj.bias.copy_(mha.in_proj_bias[D:])
            self.out_proj.bias.copy_(mha.out_proj.bias)
