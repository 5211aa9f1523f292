"""The attention layer and the linear layers it and the model run on.

``MultiHeadSelfAttention`` is one module, one set of weights, two paths: an explicit,
readable path that can return attention weights and a fused path
(``scaled_dot_product_attention``) used for training and correction. Its masks follow
``torch.nn.MultiheadAttention``'s conventions, and the tests check both paths against it.
``linear`` is the one place a linear layer runs (oneDNN with a fused GELU for fp32 CPU
inference on x86-64). Torch and the standard library only.

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
