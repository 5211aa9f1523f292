"""Model parts: positional encoding, layout, equivariance, configs, losses."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from locusformer.errors import InputError
from locusformer.model import attention as attention_module
from locusformer.model.attention import linear
from locusformer.model.config import ModelConfig, TrainConfig
from locusformer.model.layout import build_layout
from locusformer.model.losses import batch_mean_distance, batch_mmd, confusion_loss, grad_reverse
from locusformer.model.network import (
    UNPLACED,
    LocusFormer,
    chromosome_code,
    masked_mean,
    sinusoidal_encoding,
)
from locusformer.simulate.datasets import simulate


def loci_table() -> pd.DataFrame:
    """5 loci on chr1, 3 on chr2, 2 unplaced."""
    chr1 = [1_000_000, 2_000_000, 3_000_000, 4_000_000, 9_000_000]
    chr2 = [500_000, 1_500_000, 2_500_000]
    start = pd.array([*chr1, *chr2, None, None], dtype="Int64")
    return pd.DataFrame(
        {
            "gene_id": [f"g{i}" for i in range(10)],
            "chrom": ["chr1"] * 5 + ["chr2"] * 3 + ["", ""],
            "start": start,
            "end": start + 10,
            "position": np.arange(10),
            "placed": [True] * 8 + [False] * 2,
        }
    )


def test_sinusoidal_encoding_matches_formula() -> None:
    d = 6
    positions = torch.tensor([0.0, 1.0, 7.0, 123.5])
    pe = sinusoidal_encoding(positions, d)
    assert pe.shape == (4, d)
    for r, pos in enumerate(positions.tolist()):
        for i in range(d // 2):
            angle = pos / 10000 ** (2 * i / d)
            assert pe[r, 2 * i].item() == pytest.approx(math.sin(angle), abs=1e-6)
            assert pe[r, 2 * i + 1].item() == pytest.approx(math.cos(angle), abs=1e-6)


def test_layout_patches_never_straddle_chromosomes() -> None:
    layout = build_layout(loci_table(), patch_size=2)
    n = 10  # the padding slot index
    assert layout.n_loci == n
    assert layout.token_index.tolist() == [[0, 1], [2, 3], [4, n], [5, 6], [7, n], [8, 9]]
    assert layout.token_chrom.tolist() == [0, 0, 0, 1, 1, UNPLACED]
    assert layout.token_position.tolist() == [0, 1, 2, 3, 4, 5]  # "rank": token index


def test_layout_coordinate_positions_are_megabases_per_chromosome() -> None:
    layout = build_layout(loci_table(), patch_size=2, position_scale="coordinate")
    # chr1: mean starts 1.5, 3.5, 9 Mb; chr2: 1, 2.5 Mb; unplaced: index within its run.
    want = [1.5, 3.5, 9.0, 1.0, 2.5, 0.0]
    assert layout.token_position.tolist() == pytest.approx(want)


def test_chromosome_codes() -> None:
    assert chromosome_code("chr1") == chromosome_code("1") == 0
    assert chromosome_code("chrX") == 22
    assert chromosome_code("MT") == chromosome_code("chrM") == 24
    for other in ["", None, "chrUn_KI270302v1", "scaffold_9"]:
        assert chromosome_code(other) == UNPLACED


def tiny_config(**overrides: object) -> ModelConfig:
    base = dict(patch_size=2, d_model=16, n_heads=2, n_layers=2, latent_dim=4, dropout=0.0)
    base.update(overrides)
    return ModelConfig(**base)


def test_without_position_identity_or_chromosome_the_encoder_is_permutation_equivariant() -> None:
    config = tiny_config(
        patch_size=1, positional_encoding=False, chromosome_embedding=False, locus_embedding="none"
    )
    torch.manual_seed(0)
    model = LocusFormer(config, build_layout(loci_table(), 1), 2).eval()
    x = torch.randn(3, 10)
    perm = torch.randperm(10)
    with torch.no_grad():
        h, _ = model.encoder(model.embed(x))  # (B, T, D) token states
        h_perm, _ = model.encoder(model.embed(x[:, perm]))
    torch.testing.assert_close(h_perm, h[:, perm], atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "switch",
    [
        {"positional_encoding": True},
        {"positional_encoding": "learned"},
        {"chromosome_embedding": True},
        {"locus_embedding": "vector"},
    ],
)
def test_each_identity_signal_breaks_equivariance(switch: dict) -> None:
    off = {"positional_encoding": False, "chromosome_embedding": False, "locus_embedding": "none"}
    config = tiny_config(patch_size=1, **{**off, **switch})
    torch.manual_seed(0)
    model = LocusFormer(config, build_layout(loci_table(), 1), 2).eval()
    if model.embed.locus_vector is not None:  # starts at zero; give it something
        torch.nn.init.normal_(model.embed.locus_vector)
    x = torch.randn(3, 10)
    perm = torch.arange(10).flip(0)
    with torch.no_grad():
        h, _ = model.encoder(model.embed(x))
        h_perm, _ = model.encoder(model.embed(x[:, perm]))
    assert not torch.allclose(h_perm, h[:, perm], atol=1e-3)


def test_forward_shapes_and_standardization_round_trip() -> None:
    sim = simulate(n_samples=8, n_loci=30, seed=0)
    model = LocusFormer(tiny_config(), build_layout(sim.loci, 2), 3)
    X = torch.from_numpy(sim.X)
    std = X.std(0)
    std[3] = 0.0  # a constant gene must not divide by zero
    model.set_standardization(X.mean(0), std)
    assert model.gene_std[3] == 1.0
    torch.testing.assert_close(model.unstandardize(model.standardize(X)), X)
    out = model(model.standardize(X), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1]))
    assert out.latent.shape == (8, 4)
    assert out.recon.shape == (8, 30)
    assert out.batch_logits.shape == (8, 3)
    _, weights = model.encode(model.standardize(X), need_weights=True)
    assert len(weights) == 2 and weights[0].shape == (8, 2, model.n_tokens, model.n_tokens)


def test_state_dict_round_trip_rebuilds_the_layout() -> None:
    sim = simulate(n_samples=4, n_loci=30, seed=1)
    config = tiny_config(position_scale="coordinate")
    model = LocusFormer(config, build_layout(sim.loci, 2, "coordinate"), 2).eval()
    again = LocusFormer.from_state_dict(config, model.state_dict(), 2).eval()
    x, b = torch.randn(4, 30), torch.tensor([0, 1, 0, 1])
    with torch.no_grad():
        torch.testing.assert_close(again(x, b).recon, model(x, b).recon, atol=0, rtol=0)


def test_reference_condition() -> None:
    model = LocusFormer(tiny_config(), build_layout(loci_table(), 2), 2)
    mean = model.reference_condition(None, 3, torch.device("cpu"))
    torch.testing.assert_close(mean, torch.full((3, 2), 0.5))
    torch.testing.assert_close(
        model.reference_condition(1, 1, torch.device("cpu")), torch.tensor([[0.0, 1.0]])
    )
    with pytest.raises(ValueError, match="batch code 2 out of range for 2 batches"):
        model.reference_condition(2, 1, torch.device("cpu"))


def test_gradient_reversal_flips_and_scales_the_gradient() -> None:
    x = torch.ones(3, requires_grad=True)
    (grad_reverse(x, 0.25) * torch.tensor([1.0, 2.0, 3.0])).sum().backward()
    torch.testing.assert_close(x.grad, torch.tensor([-0.25, -0.5, -0.75]))


def _grad_sum(module: torch.nn.Module) -> float:
    return sum(float(p.grad.abs().sum()) for p in module.parameters() if p.grad is not None)


def test_confusion_mode_splits_the_gradients_between_encoder_and_discriminator() -> None:
    """The discriminator learns from batch_logits only, the encoder from the confusion
    logits only; "reversal" sends the discriminator's gradient into the encoder."""
    torch.manual_seed(0)
    model = LocusFormer(tiny_config(), build_layout(loci_table(), 2), 2)
    x, b = torch.randn(6, 10), torch.tensor([0, 1, 0, 1, 0, 1])
    prior = torch.tensor([0.5, 0.5])

    def grads(loss: torch.Tensor) -> tuple[float, float]:
        model.zero_grad(set_to_none=True)
        loss.backward()
        return _grad_sum(model.encoder), _grad_sum(model.discriminator)

    out = model(x, b, adversary="confusion")
    encoder, disc = grads(F.cross_entropy(out.batch_logits, b))
    assert encoder == 0 and disc > 0
    out = model(x, b, adversary="confusion")
    encoder, disc = grads(confusion_loss(out.confusion_logits, prior))
    assert encoder > 0 and disc == 0
    torch.testing.assert_close(out.confusion_logits, out.batch_logits)  # same network
    out = model(x, b, adversary_weight=0.5)  # "reversal"
    assert out.confusion_logits is None
    encoder, disc = grads(F.cross_entropy(out.batch_logits, b))
    assert encoder > 0 and disc > 0


def test_confusion_loss_is_least_when_the_discriminator_predicts_the_prior() -> None:
    prior = torch.tensor([0.2, 0.3, 0.5])
    at_prior = confusion_loss(prior.log().expand(4, 3), prior)
    entropy = -(prior * prior.log()).sum()
    torch.testing.assert_close(at_prior, entropy)
    g = torch.Generator().manual_seed(1)
    for _ in range(20):
        assert confusion_loss(torch.randn(4, 3, generator=g), prior) > entropy
    # Confident and right about one batch is as bad as confident and wrong.
    sure = torch.tensor([[9.0, 0.0, 0.0]])
    assert confusion_loss(sure, prior) > confusion_loss(torch.zeros(1, 3), prior)


def test_masked_mean() -> None:
    h = torch.arange(12.0).view(1, 4, 3)
    mask = torch.tensor([[False, False, True, True]])
    torch.testing.assert_close(masked_mean(h, mask), torch.tensor([[1.5, 2.5, 3.5]]))
    torch.testing.assert_close(
        masked_mean(h, mask, scaled=True), torch.tensor([[1.5, 2.5, 3.5]]) * 2**0.5
    )


def test_batch_mean_distance_is_scale_free_and_zero_for_equal_means() -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(40, 5, generator=g)
    batch = torch.arange(40) % 2
    shifted = z + batch[:, None] * torch.tensor([0.0, 0.0, 0.0, 0.0, 0.05])
    a = batch_mean_distance(shifted, batch, 2)
    torch.testing.assert_close(batch_mean_distance(1000 * shifted, batch, 2), a, rtol=1e-4, atol=0)
    centered = z - torch.stack([z[batch == b].mean(0) for b in (0, 1)])[batch]
    assert batch_mean_distance(centered, batch, 2).item() == pytest.approx(0.0, abs=1e-10)
    one_batch = torch.zeros(40, dtype=torch.long)
    assert batch_mean_distance(z, one_batch, 2).item() == pytest.approx(0.0, abs=1e-10)
    assert batch_mmd(z, batch, 2).item() >= -1e-6


@pytest.mark.parametrize("mode", ["sinusoidal", "learned", "none"])
def test_each_positional_encoding_builds_and_trains_one_step(mode: str) -> None:
    sim = simulate(n_samples=32, n_loci=40, seed=4)
    torch.manual_seed(0)
    model = LocusFormer(tiny_config(positional_encoding=mode), build_layout(sim.loci, 2), 2)
    embed = model.embed
    assert (embed.position_encoding is not None) == (mode == "sinusoidal")
    assert (embed.position_embedding is not None) == (mode == "learned")
    if mode == "learned":
        weight = embed.position_embedding.weight
        assert weight.shape == (model.n_tokens, 16)
        assert 0.01 < weight.std().item() < 0.04  # small beside the value projection
        before = weight.detach().clone()
    x = torch.from_numpy(sim.X)
    model.set_standardization(x.mean(0), x.std(0))
    x, batch = model.standardize(x), torch.from_numpy(sim.batch) % 2
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    loss = F.mse_loss(model(x, batch).recon, x)
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss)
    if mode == "learned":
        assert not torch.equal(embed.position_embedding.weight, before)  # it is trained


def test_boolean_positional_encoding_of_old_configs_still_means_the_same() -> None:
    assert ModelConfig.from_dict({"positional_encoding": True}).positional_encoding == "sinusoidal"
    assert ModelConfig.from_dict({"positional_encoding": False}).positional_encoding == "none"
    assert ModelConfig(positional_encoding=False) == ModelConfig(positional_encoding="none")
    assert ModelConfig().positional_encoding == "sinusoidal"
    with pytest.raises(InputError, match="positional_encoding"):
        ModelConfig.from_dict({"positional_encoding": "rotary"})
    with pytest.raises(InputError, match="positional_encoding"):
        ModelConfig.from_dict({"positional_encoding": 1})


@pytest.mark.parametrize(
    ("mode", "written"), [("learned", "learned"), ("sinusoidal", True), ("none", False)]
)
def test_a_saved_model_loads_with_its_positional_encoding(tmp_path, mode, written) -> None:
    import json

    from locusformer.infer.correct import correct
    from locusformer.model.files import load_model, save_model
    from locusformer.train.loop import train_corrector

    sim = simulate(n_samples=40, n_loci=40, n_batches=2, seed=5)
    labels = [f"b{b}" for b in sim.batch]
    config = dict(patch_size=4, d_model=16, n_heads=2, n_layers=1, latent_dim=4)
    model, _ = train_corrector(
        sim.X, labels, sim.loci, {**config, "positional_encoding": mode},
        {"max_epochs": 2, "batch_size": 20, "val_fraction": 0.0},
        seed=0, device="cpu", progress=False,
    )  # fmt: skip
    save_model(model, tmp_path / "m.pt", tmp_path / "m.json")
    # A model saved before the choice holds a bool: write one as such.
    record = json.loads((tmp_path / "m.json").read_text())
    record["model_config"]["positional_encoding"] = written
    (tmp_path / "m.json").write_text(json.dumps(record))
    loaded = load_model(tmp_path / "m.pt", tmp_path / "m.json")
    assert loaded.config.positional_encoding == mode
    expected, _ = correct(model, sim.X, labels, device="cpu")
    again, _ = correct(loaded, sim.X, labels, device="cpu")
    np.testing.assert_array_equal(again, expected)


def test_config_dicts() -> None:
    config = ModelConfig.from_dict({"patch_size": 4, "dropout": "0.2"})
    assert config.patch_size == 4 and config.dropout == 0.2
    assert ModelConfig.from_dict(config.to_dict()) == config
    assert TrainConfig.from_dict({"lr": "1e-3"}).lr == 1e-3  # YAML reads 1e-3 as a string
    assert TrainConfig.from_dict(None) == TrainConfig()
    with pytest.raises(InputError, match="unknown key 'patchsize'"):
        ModelConfig.from_dict({"patchsize": 4})
    with pytest.raises(InputError, match="unknown key 'learning_rate'"):
        TrainConfig.from_dict({"learning_rate": 1e-3})
    with pytest.raises(InputError, match="n_heads"):
        ModelConfig.from_dict({"d_model": 30, "n_heads": 4})
    with pytest.raises(InputError, match="positional_encoding"):
        ModelConfig.from_dict({"positional_encoding": "yes"})
    with pytest.raises(InputError, match="position_scale"):
        ModelConfig.from_dict({"position_scale": "bp"})
    with pytest.raises(InputError, match="patch_size"):
        ModelConfig.from_dict({"patch_size": 2.5})


def test_batch_terms_match_plain_loop_versions() -> None:
    """The branch-free batch terms equal straightforward per-batch loops."""
    g = torch.Generator().manual_seed(1)
    z = torch.randn(30, 4, generator=g)
    batch = torch.randint(0, 3, (30,), generator=g)
    batch[batch == 2] = 0  # batches 2 and 3 absent
    present = [b for b in range(4) if (batch == b).any()]

    d2 = torch.cdist(z, z).pow(2)
    kernel = sum(torch.exp(-d2 / (d2.mean() * s)) for s in (0.25, 1.0, 4.0))
    terms = []
    for b in present:
        i = batch == b
        terms.append(
            kernel[i][:, i].mean() + kernel[~i][:, ~i].mean() - 2 * kernel[i][:, ~i].mean()
        )
    torch.testing.assert_close(batch_mmd(z, batch, 4), torch.stack(terms).mean())

    means = {b: z[batch == b].mean(0) for b in present}
    centered = torch.stack([z[i] - means[int(batch[i])] for i in range(30)])
    s_w = centered.T @ centered / (30 - len(present))
    s_w = s_w + 1e-2 * (s_w.trace() / 4 + 1e-8) * torch.eye(4)
    mu = z.mean(0)
    want = sum(
        (batch == b).float().mean() * (means[b] - mu) @ torch.linalg.solve(s_w, means[b] - mu)
        for b in present
    )
    torch.testing.assert_close(batch_mean_distance(z, batch, 4), want)


onednn_only = pytest.mark.skipif(not attention_module.ONEDNN, reason="this torch has no oneDNN")


@onednn_only
@pytest.mark.parametrize("gelu", [False, True])
def test_the_onednn_linear_equals_the_plain_one(gelu: bool, monkeypatch) -> None:
    layer = torch.nn.Linear(64, 96)
    x = torch.randn(3, 7, 64)
    with torch.inference_mode():
        fast = linear(x, layer, gelu=gelu)
        monkeypatch.setattr(attention_module, "ONEDNN", False)
        plain = linear(x, layer, gelu=gelu)
    expected = F.gelu(layer(x)) if gelu else layer(x)
    torch.testing.assert_close(plain, expected.detach(), atol=0, rtol=0)
    torch.testing.assert_close(fast, plain, atol=1e-5, rtol=1e-5)
    assert fast.shape == (3, 7, 96)


@onednn_only
def test_inference_takes_the_onednn_kernel_and_training_the_plain_one() -> None:
    layer, x = torch.nn.Linear(8, 4), torch.randn(5, 8)
    with torch.profiler.profile() as prof, torch.inference_mode():
        linear(x, layer)
    assert "mkldnn::_linear_pointwise" in {event.name for event in prof.events()}
    y = linear(x, layer, gelu=True)  # autograd on: PyTorch's own backward must exist
    y.sum().backward()
    assert layer.weight.grad is not None and y.grad_fn is not None


@onednn_only
def test_a_model_corrects_alike_with_and_without_onednn(monkeypatch) -> None:
    sim = simulate(n_samples=16, n_loci=60, seed=2)
    model = LocusFormer(tiny_config(), build_layout(sim.loci, 4), 2).eval()
    x, b = torch.from_numpy(sim.X), torch.tensor([0, 1] * 8)
    with torch.inference_mode():
        fast = model(model.standardize(x), b)
        monkeypatch.setattr(attention_module, "ONEDNN", False)
        plain = model(model.standardize(x), b)
    torch.testing.assert_close(fast.recon, plain.recon, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(fast.latent, plain.latent, atol=1e-5, rtol=1e-4)


def test_cycle_term_is_zero_for_a_batch_free_round_trip_and_scale_free() -> None:
    from locusformer.model.network import LossWeights, ModelOutput

    torch.manual_seed(0)
    model = LocusFormer(tiny_config(), build_layout(loci_table(), 2), 2)
    x, b = torch.randn(8, 10), torch.tensor([0, 1] * 4)
    z = torch.randn(8, 4)
    out = ModelOutput(z, torch.zeros(8, 10), torch.zeros(8, 2), None, z.clone())
    assert float(model.loss(x, b, out, LossWeights(cycle=1.0)).cycle) == 0.0
    moved = ModelOutput(z, torch.zeros(8, 10), torch.zeros(8, 2), None, z + 0.5)
    scaled = ModelOutput(3 * z, torch.zeros(8, 10), torch.zeros(8, 2), None, 3 * (z + 0.5))
    one = model.loss(x, b, moved, LossWeights(cycle=1.0))
    torch.testing.assert_close(one.cycle, model.loss(x, b, scaled, LossWeights(cycle=1.0)).cycle)
    without = model.loss(x, b, moved, LossWeights())
    torch.testing.assert_close(one.total - without.total, one.cycle)  # weighs what it says


def test_forward_with_cycle_batches_reencodes_the_decoded_sample() -> None:
    torch.manual_seed(0)
    model = LocusFormer(tiny_config(), build_layout(loci_table(), 2), 2).eval()
    x, b = torch.randn(4, 10), torch.tensor([0, 1, 0, 1])
    with torch.no_grad():
        out = model(x, b, cycle_batch=1 - b)
        z, _ = model.encode(x)
        want, _ = model.encode(model.decode(z, model.condition(1 - b)))
    assert out.cycle_latent is not None
    torch.testing.assert_close(out.cycle_latent, want)
    assert model(x, b).cycle_latent is None
