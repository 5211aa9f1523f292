"""MultiHeadSelfAttention: explicit path == fused path == torch.nn.MultiheadAttention."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from locusformer.model.attention import MultiHeadSelfAttention, stable_softmax

D, H, B, T = 16, 4, 3, 7


def make_pair(
    seed: int = 0, bias: bool = True
) -> tuple[MultiHeadSelfAttention, nn.MultiheadAttention]:
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(D, H, bias=bias, batch_first=True).eval()
    with torch.no_grad():  # non-zero biases so that bias handling is exercised too
        for name, p in ref.named_parameters():
            if "bias" in name:
                p.normal_(0, 0.1)
    ours = MultiHeadSelfAttention(D, H, bias=bias).eval()
    ours.load_from_torch(ref)
    return ours, ref


def masks(kind: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(key_padding_mask, attn_mask) in nn.MultiheadAttention conventions, no empty rows."""
    g = torch.Generator().manual_seed(1)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[0, -2:] = True  # sample 0: last two keys are padding
    kpm[2, 1] = True
    causal = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)  # True = blocked
    additive = torch.randn(T, T, generator=g)
    additive[causal] = float("-inf")
    return {
        "none": (None, None),
        "key_padding": (kpm, None),
        "attn_bool": (None, causal),
        "attn_float": (None, additive),
        "both": (kpm, causal),
    }[kind]


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("kind", ["none", "key_padding", "attn_bool", "attn_float", "both"])
def test_explicit_fused_and_torch_agree(kind: str, bias: bool) -> None:
    ours, ref = make_pair(bias=bias)
    x = torch.randn(B, T, D, generator=torch.Generator().manual_seed(2))
    kpm, am = masks(kind)
    with torch.no_grad():
        want, want_w = ref(
            x,
            x,
            x,
            key_padding_mask=kpm,
            attn_mask=am,
            need_weights=True,
            average_attn_weights=False,
        )
        explicit, w = ours(x, key_padding_mask=kpm, attn_mask=am, need_weights=True)
        fused, none = ours(x, key_padding_mask=kpm, attn_mask=am, fused=True)
    assert none is None
    torch.testing.assert_close(explicit, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(w, want_w, atol=1e-5, rtol=0)


def test_three_dim_attn_mask_per_head() -> None:
    ours, ref = make_pair()
    x = torch.randn(B, T, D)
    am = torch.rand(B * H, T, T) < 0.3
    am[..., 0] = False  # every row keeps one key
    with torch.no_grad():
        want, _ = ref(x, x, x, attn_mask=am, need_weights=False)
        explicit, _ = ours(x, attn_mask=am, need_weights=True)
        fused, _ = ours(x, attn_mask=am)
    torch.testing.assert_close(explicit, want, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused, want, atol=1e-5, rtol=0)


def test_masked_keys_get_exactly_zero_weight() -> None:
    ours, _ = make_pair()
    kpm, am = masks("both")
    _, w = ours(torch.randn(B, T, D), key_padding_mask=kpm, attn_mask=am, need_weights=True)
    blocked = kpm[:, None, None, :] | am[None, None]  # (B, 1, T, T)
    assert torch.all(w.masked_select(blocked.expand_as(w)) == 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(B, H, T))


@pytest.mark.parametrize("fused", [False, True])
def test_padding_does_not_change_real_tokens(fused: bool) -> None:
    ours, _ = make_pair()
    x = torch.randn(B, T, D)
    junk = 100 * torch.randn(B, 5, D)  # large values: any leak would show
    padded = torch.cat([x, junk], dim=1)
    kpm = torch.zeros(B, T + 5, dtype=torch.bool)
    kpm[:, T:] = True
    with torch.no_grad():
        plain, _ = ours(x, fused=fused)
        out, _ = ours(padded, key_padding_mask=kpm, fused=fused)
    torch.testing.assert_close(out[:, :T], plain, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fused", [False, True])
def test_fully_masked_row_gives_zeros_not_nan(fused: bool) -> None:
    ours, _ = make_pair()
    ours.train()  # with dropout active too
    ours.dropout = 0.1
    x = torch.randn(B, T, D, requires_grad=True)
    kpm = torch.zeros(B, T, dtype=torch.bool)
    kpm[1] = True  # sample 1 has no key at all
    out, _ = ours(x, key_padding_mask=kpm, fused=fused)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    # No key: the attention output is 0, so only the output projection's bias is left.
    torch.testing.assert_close(out[1], ours.out_proj.bias.expand(T, D).detach())


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_huge_logits_in_low_precision_do_not_overflow(dtype: torch.dtype) -> None:
    logits = torch.tensor([[1e4, 1e4 - 1, -1e4, 0.0], [-1e4, -1e4, -1e4, -1e4]], dtype=dtype)
    w = stable_softmax(logits)
    assert w.dtype == dtype and torch.isfinite(w).all()
    torch.testing.assert_close(w.float().sum(-1), torch.ones(2), atol=1e-2, rtol=0)
    naive = torch.exp(logits.float()) / torch.exp(logits.float()).sum(-1, keepdim=True)
    assert torch.isnan(naive).any()  # what the max subtraction avoids

    # Through the module's explicit path: identity projections make q = k = v = x, so
    # with |x| = 100 and head width 4 the logits reach 100 * 100 * 4 / 2 = 2e4.
    attn = MultiHeadSelfAttention(8, 2).to(dtype)
    with torch.no_grad():
        attn.in_proj.weight.copy_(torch.cat([torch.eye(8)] * 3))
        attn.in_proj.bias.zero_()
    x = 100 * torch.sign(torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(0)))
    out, w = attn(x.to(dtype), need_weights=True)
    assert torch.isfinite(out).all() and torch.isfinite(w).all()
