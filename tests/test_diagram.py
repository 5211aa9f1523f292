"""The attention flow diagram: valid SVG whose arrows carry the configuration's shapes."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from locusformer.model.config import ModelConfig
from locusformer.report.diagram import DEMO_TOKENS, attention_svg, main, readme_svg

SVG = "{http://www.w3.org/2000/svg}"
DOC = Path(__file__).resolve().parents[1] / "docs" / "attention.svg"


def shapes_on_arrows(svg: str) -> dict[str, str]:
    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg"
    labels = [t for t in root.iter(f"{SVG}text") if t.get("class") == "shape"]
    for t in labels:  # the label starts with the shape it claims
        assert t.text.startswith(t.get("data-shape")), t.text
    return {t.get("data-edge"): t.get("data-shape") for t in labels}


def steps_top_to_bottom(svg: str) -> list[str]:
    """The bold first line of each box, ordered by the box's height on the page."""
    root = ET.fromstring(svg)
    boxes = [r for r in root.iter(f"{SVG}rect") if r.get("class") == "step"]
    bold = [t for t in root.iter(f"{SVG}text") if t.get("font-weight") == "bold"]
    steps = []
    for rect in boxes:
        top = float(rect.get("y"))
        left, right = float(rect.get("x")), float(rect.get("x")) + float(rect.get("width"))
        inside = [
            t.text
            for t in bold
            if top < float(t.get("y")) < top + float(rect.get("height"))
            and left < float(t.get("x")) < right
        ]
        assert len(inside) == 1, inside
        steps.append((top, float(rect.get("x")), inside[0]))
    return [name for _, _, name in sorted(steps)]


@pytest.mark.parametrize(
    ("config", "tokens"),
    [(ModelConfig(d_model=96, n_heads=3, n_layers=5, patch_size=8), 10), (ModelConfig(), 74)],
)
def test_the_arrows_carry_the_models_shapes(config: ModelConfig, tokens: int) -> None:
    svg = attention_svg(config, tokens)
    D, H, K, T = config.d_model, config.n_heads, config.d_model // config.n_heads, tokens
    per_token = f"(B, {T}, {D})"
    per_head = f"(B, {H}, {T}, {K})"
    scores = f"(B, {H}, {T}, {T})"
    assert shapes_on_arrows(svg) == {
        "input": per_token,
        "q": per_head,
        "k": per_head,
        "v": per_head,
        "scores": scores,
        "scaled": scores,
        "masked": scores,
        "weights": scores,
        "heads_out": per_head,
        "concat": per_token,
        "output": per_token,
    }
    root = ET.fromstring(svg)
    assert root.get("data-layers") == str(config.n_layers)
    desc = root.find(f"{SVG}desc").text
    assert f"T = {T} tokens" in desc and f"{config.n_layers} layers" in desc
    assert f"d_k = {K}" in desc and f"H = {H} heads" in desc
    texts = " ".join(t.text for t in root.iter(f"{SVG}text"))
    assert f"√{K}" in texts and f"× {config.n_layers}:" in texts


def test_scaling_and_softmax_are_steps_of_their_own_in_order() -> None:
    steps = steps_top_to_bottom(attention_svg(ModelConfig(), 74))
    assert steps == [
        "input X",
        "Q = X·W_Q",
        "K = X·W_K",
        "V = X·W_V",
        "Q·Kᵀ",
        "÷ √d_k = √16 = 4",
        "+ mask (optional)",
        "softmax over keys",
        "× V",
        "concat heads",
        "· W_O",
        "output",
    ]


def test_without_a_token_count_the_diagram_says_T() -> None:
    shapes = shapes_on_arrows(attention_svg(ModelConfig(d_model=32, n_heads=8)))
    assert shapes["weights"] == "(B, 8, T, T)" and shapes["v"] == "(B, 8, T, 4)"


def test_the_committed_readme_diagram_is_what_the_code_draws(tmp_path: Path) -> None:
    # If this fails: python -m locusformer.report.diagram docs/attention.svg
    assert DOC.read_text(encoding="utf-8") == readme_svg()
    assert shapes_on_arrows(readme_svg().split("\n", 1)[1])["weights"] == (
        f"(B, 4, {DEMO_TOKENS}, {DEMO_TOKENS})"
    )
    assert main([str(tmp_path / "a.svg")]) == 0
    assert (tmp_path / "a.svg").read_text(encoding="utf-8") == readme_svg()
    assert main([]) == 2
