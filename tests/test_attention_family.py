"""Cross-attention and causal masking: explicit path == fused path == nn.MultiheadAttention.

And the refactor that shares their code with MultiHeadSelfAttention leaves its numbers
bitwise as they were (checked against a verbatim copy of the layer before it).
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from locusformer.model.attention import (
    MultiHeadCrossAttention,
    MultiHeadSelfAttention,
    causal_mask,
    linear,
    merge_masks,
    stable_softmax,
)

D, H, B, T, S = 16, 4, 3, 7, 5


def with_biases(ref: nn.MultiheadAttention) -> nn.MultiheadAttention:
    with torch.no_grad():  # non-zero biases so that bias handling is exercised too
        for name, p in ref.named_parameters():
            if "bias" in name:
                p.normal_(0, 0.1)
    return ref.eval()


def cross_pair(
    context_dim: int | None = None, bias: bool = True
) -> tuple[MultiHeadCrossAttention, nn.MultiheadAttention]:
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(
        D, H, bias=bias, batch_first=True, kdim=context_dim, vdim=context_dim
    )
    ref = with_biases(ref)
    ours = MultiHeadCrossAttention(D, H, bias=bias, context_dim=context_dim).eval()
    ours.load_from_torch(ref)
    return ours, ref


def cross_masks(kind: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(key_padding_mask (B, S), attn_mask (T, S)), torch conventions, no empty rows."""
    g = torch.Generator().manual_seed(1)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[0, -2:] = True  # sample 0: last two context tokens are padding
    kpm[2, 1] = True
    blocked = torch.rand(T, S, generator=g) < 0.3
    blocked[:, 0] = False  # every query keeps context token 0
    additive = torch.randn(T, S, generator=g).masked_fill(blocked, float("-inf"))
    return {
        "none": (None, None),
        "key_padding": (kpm, None),
        "attn_bool": (None, blocked),
        "attn_float": (None, additive),
        "both": (kpm, blocked),
    }[kind]


def inputs(context_dim: int = D) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(2)
    return torch.randn(B, T, D, generator=g), torch.randn(B, S, context_dim, generator=g)


@pytest.mark.parametrize("context_dim", [None, 12])
@pytest.mark.parametrize("kind", ["none", "key_padding", "attn_bool", "attn_float", "both"])
def test_cross_attention_explicit_fused_and_torch_agree(kind: str, context_dim: int | None):
    ours, ref = cross_pair(context_dim)
    x, ctx = inputs(context_dim or D)
    kpm, am = cross_masks(kind)
    with torch.no_grad():
        want, want_w = ref(
            x, ctx, ctx, key_padding_mask=kpm, attn_mask=am, average_attn_weights=False
        )
        explicit, w = ours(x, ctx, key_padding_mask=kpm, attn_mask=am, need_weights=True)
        fused, none = ours(x, ctx, key_padding_mask=kpm, attn_mask=am, fused=True)
    assert none is None and w.shape == (B, H, T, S) and explicit.shape == (B, T, D)
    torch.testing.assert_close(explicit, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(w, want_w, atol=1e-5, rtol=0)


def test_cross_attention_without_biases_and_a_per_head_mask() -> None:
    ours, ref = cross_pair(bias=False)
    x, ctx = inputs()
    am = torch.rand(B * H, T, S, generator=torch.Generator().manual_seed(3)) < 0.4
    am[..., 0] = False
    with torch.no_grad():
        want, want_w = ref(x, ctx, ctx, attn_mask=am, average_attn_weights=False)
        explicit, w = ours(x, ctx, attn_mask=am, need_weights=True)
        fused, _ = ours(x, ctx, attn_mask=am)
    torch.testing.assert_close(explicit, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(w, want_w, atol=1e-5, rtol=0)


def test_context_padding_does_not_change_the_output() -> None:
    ours, _ = cross_pair()
    x, ctx = inputs()
    junk = 100 * torch.randn(B, 4, D)  # large values: any leak would show
    kpm = torch.zeros(B, S + 4, dtype=torch.bool)
    kpm[:, S:] = True
    with torch.no_grad():
        for fused in (False, True):
            plain, _ = ours(x, ctx, fused=fused)
            padded, _ = ours(x, torch.cat([ctx, junk], 1), key_padding_mask=kpm, fused=fused)
            torch.testing.assert_close(padded, plain, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fused", [False, True])
def test_cross_attention_to_an_empty_context_gives_zeros_not_nan(fused: bool) -> None:
    ours, _ = cross_pair()
    ours.train()
    ours.dropout = 0.1
    x, ctx = inputs()
    x.requires_grad_(True)
    kpm = torch.zeros(B, S, dtype=torch.bool)
    kpm[1] = True  # sample 1's context is all padding
    out, _ = ours(x, ctx, key_padding_mask=kpm, fused=fused)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    torch.testing.assert_close(out[1], ours.out_proj.bias.expand(T, D).detach())


def test_causal_mask_is_top_left_aligned_like_sdpa() -> None:
    m = causal_mask(4, 3)
    assert m.tolist() == [
        [False, True, True],
        [False, False, True],
        [False, False, False],
        [False, False, False],
    ]
    q, k, v = torch.randn(3, 1, 2, 4, 8).unbind(0)
    k, v = k[:, :, :3], v[:, :, :3]
    flagged = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    masked = F.scaled_dot_product_attention(q, k, v, attn_mask=~m)  # bool: True = keep
    torch.testing.assert_close(flagged, masked)


def self_pair() -> tuple[MultiHeadSelfAttention, nn.MultiheadAttention]:
    torch.manual_seed(0)
    ref = with_biases(nn.MultiheadAttention(D, H, batch_first=True))
    ours = MultiHeadSelfAttention(D, H).eval()
    ours.load_from_torch(ref)
    return ours, ref


@pytest.mark.parametrize("padding", [False, True])
def test_causal_self_attention_matches_torch(padding: bool) -> None:
    ours, ref = self_pair()
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(4))
    kpm = None
    if padding:
        kpm = torch.zeros(B, T, dtype=torch.bool)
        kpm[0, -3:] = True
    with torch.no_grad():
        want, want_w = ref(
            x, x, x, key_padding_mask=kpm, attn_mask=causal_mask(T, T),
            average_attn_weights=False,
        )  # fmt: skip
        explicit, w = ours(x, key_padding_mask=kpm, need_weights=True, is_causal=True)
        fused, _ = ours(x, key_padding_mask=kpm, fused=True, is_causal=True)
    torch.testing.assert_close(explicit, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(w, want_w, atol=1e-5, rtol=0)
    assert torch.all(w.masked_select(causal_mask(T, T).expand_as(w)) == 0)
    # Token 0 sees itself only; changing a later token leaves the earlier ones alone.
    later = x.clone()
    later[:, -1] += 10.0
    with torch.no_grad():
        moved, _ = ours(later, key_padding_mask=kpm, fused=True, is_causal=True)
    torch.testing.assert_close(moved[:, :-1], fused[:, :-1], atol=1e-6, rtol=0)
    assert not torch.allclose(moved[:, -1], fused[:, -1])


@pytest.mark.parametrize("padding", [False, True])
def test_causal_cross_attention_matches_torch(padding: bool) -> None:
    ours, ref = cross_pair(context_dim=12)
    x, ctx = inputs(12)
    kpm = None
    if padding:
        kpm = torch.zeros(B, S, dtype=torch.bool)
        kpm[2, 1:] = True  # keeps context token 0, which every causal row sees
    with torch.no_grad():
        want, want_w = ref(
            x, ctx, ctx, key_padding_mask=kpm, attn_mask=causal_mask(T, S),
            average_attn_weights=False,
        )  # fmt: skip
        explicit, w = ours(x, ctx, key_padding_mask=kpm, need_weights=True, is_causal=True)
        fused, _ = ours(x, ctx, key_padding_mask=kpm, fused=True, is_causal=True)
    torch.testing.assert_close(explicit, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(w, want_w, atol=1e-5, rtol=0)


def test_cross_attention_gradients_agree_between_paths() -> None:
    ours, _ = cross_pair()
    x, ctx = inputs()
    grads = []
    for fused in (False, True):
        ours.zero_grad()
        a, b = x.clone().requires_grad_(True), ctx.clone().requires_grad_(True)
        out, _ = ours(a, b, fused=fused, is_causal=True)
        out.pow(2).sum().backward()
        grads.append([a.grad, b.grad, ours.kv_proj.weight.grad.clone()])
    for explicit, fused in zip(*grads, strict=True):
        torch.testing.assert_close(explicit, fused, atol=1e-5, rtol=1e-5)


# -- the refactor leaves self-attention bitwise as it was ------------------------------


class SelfAttentionBefore(nn.Module):
    """MultiHeadSelfAttention as it was before cross-attention shared its code (verbatim)."""

    def __init__(self, d_model: int, n_heads: int, dropout: float = 0.0, bias: bool = True):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.dropout = dropout
        self.fused = True
        self.in_proj = nn.Linear(d_model, 3 * d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def forward(self, x, key_padding_mask=None, attn_mask=None, need_weights=False, fused=None):
        B, T, D = x.shape
        q, k, v = linear(x, self.in_proj).split(D, dim=-1)
        q, k, v = (t.view(B, T, self.n_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        mask = merge_masks(key_padding_mask, attn_mask, B, self.n_heads, q.dtype)
        use_fused = (self.fused if fused is None else fused) and not need_weights
        if use_fused:
            y, weights = self._fused(q, k, v, mask), None
        else:
            y, weights = self._explicit(q, k, v, mask)
        y = y.transpose(1, 2).reshape(B, T, D)
        return linear(y, self.out_proj), weights

    def _explicit(self, q, k, v, mask):
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        if mask is not None:
            scores = scores + mask
        weights = stable_softmax(scores)
        dropped = F.dropout(weights, self.dropout, self.training)
        return dropped @ v, weights

    def _fused(self, q, k, v, mask):
        empty_rows = None
        if mask is not None:
            empty_rows = torch.isneginf(mask).all(dim=-1, keepdim=True)
            if bool(empty_rows.any()):
                mask = mask.masked_fill(empty_rows, 0.0)
            else:
                empty_rows = None
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0
        )
        if empty_rows is not None:
            y = y.masked_fill(empty_rows, 0.0)
        return y


@pytest.mark.parametrize("masked", [False, True])
@pytest.mark.parametrize("grad", [False, True])
def test_self_attention_is_bitwise_what_it_was(masked: bool, grad: bool) -> None:
    torch.manual_seed(5)
    before = SelfAttentionBefore(D, H)
    torch.manual_seed(5)
    now = MultiHeadSelfAttention(D, H)
    # The same seed draws the same weights, in the same order (state-dict order too).
    assert list(before.state_dict()) == list(now.state_dict())
    for a, b in zip(before.state_dict().values(), now.state_dict().values(), strict=True):
        assert torch.equal(a, b)
    kpm = am = None
    if masked:
        kpm = torch.zeros(B, T, dtype=torch.bool)
        kpm[0, -2:] = True
        kpm[1] = True  # a sample with no key at all
        am = causal_mask(T, T)
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(6))
    with torch.set_grad_enabled(grad):
        for kwargs in ({"need_weights": True}, {"fused": True}):
            outs = []
            for layer in (before, now):
                xi = x.clone().requires_grad_(grad)
                y, w = layer(xi, key_padding_mask=kpm, attn_mask=am, **kwargs)
                if grad:
                    y.pow(2).sum().backward()
                    outs.append((y, w, xi.grad, layer.in_proj.weight.grad))
                    layer.zero_grad()
                else:
                    outs.append((y, w))
            for a, b in zip(*outs, strict=True):
                assert (a is None and b is None) or torch.equal(a, b)
