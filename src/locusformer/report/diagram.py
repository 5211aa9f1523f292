"""The attention pipeline as a flow diagram (SVG), drawn from a model's configuration.

``input (B, T, D) -> Q, K, V -> Q·Kᵀ -> ÷ √d_k -> (mask) -> softmax -> × V -> concat heads
-> W_O -> output``, one box a step, scaling and softmax apart, with the shapes the model
with that configuration computes written on the arrows. Plain SVG text, no dependency:
the README shows ``docs/attention.svg`` (the default configuration on the bundled demo's
loci; ``python -m locusformer.report.diagram docs/attention.svg`` writes it again) and each
dataset's report draws its trained model's inline.

Each arrow's label is a ``<text class="shape" data-edge="...">``, so that a program (the
tests) can read back which shape the diagram claims where.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple
from xml.sax.saxutils import escape, quoteattr

if TYPE_CHECKING:
    from locusformer.model.config import ModelConfig

#: Tokens of the bundled demo's 2000 loci at the default patch size 32 (one token never
#: straddles two chromosomes): measured with ``build_layout`` on the demo's loci.parquet.
DEMO_TOKENS = 74

WIDTH = 620
BOX_H = 34
FONT = "font-family:Helvetica,Arial,sans-serif"


class Box(NamedTuple):
    cx: float  # centre
    top: float
    width: float
    text: str
    note: str = ""  # a second, smaller line
    dashed: bool = False

    @property
    def bottom(self) -> float:
        return self.top + BOX_H


class Edge(NamedTuple):
    name: str  # data-edge
    x: float
    y0: float
    y1: float
    shape: str
    note: str = ""  # what the tensor is, after the shape


def shape_text(*dims: int | str) -> str:
    """``(B, 4, 74, 16)``."""
    return "(" + ", ".join(str(d) for d in dims) + ")"


def layout(config: ModelConfig, n_tokens: int | None) -> tuple[list[Box], list[Edge]]:
    """The diagram's boxes and arrows for ``config`` with ``n_tokens`` tokens (None: "T")."""
    D, H = config.d_model, config.n_heads
    K = D // H
    T: int | str = "T" if n_tokens is None else n_tokens
    tokens = shape_text("B", T, D)
    heads = shape_text("B", H, T, K)
    scores = shape_text("B", H, T, T)
    main, v_lane = 230.0, 470.0
    inp = Box(310, 56, 300, "input X", "LayerNorm of the token vectors")
    q = Box(150, 134, 130, "Q = X·W_Q", f"split into {H} heads")
    k = Box(310, 134, 130, "K = X·W_K", f"split into {H} heads")
    v = Box(v_lane, 134, 130, "V = X·W_V", f"split into {H} heads")
    qk = Box(main, 214, 240, "Q·Kᵀ", "per head: every token against every token")
    scale = Box(main, 282, 240, f"÷ √d_k = √{K} = {math.sqrt(K):.3g}", "scaling")
    mask = Box(main, 350, 240, "+ mask (optional)", "none here: every token is real", True)
    soft = Box(main, 418, 240, "softmax over keys", "row max subtracted first")
    av = Box(310, 486, 380, "× V", "weights times values, per head")
    concat = Box(310, 554, 240, "concat heads", f"{H} × {K} = {D}")
    out_proj = Box(310, 622, 240, "· W_O", "output projection")
    out = Box(310, 690, 300, "output", "added to the residual stream")
    boxes = [inp, q, k, v, qk, scale, mask, soft, av, concat, out_proj, out]
    edges = [
        Edge("input", inp.cx, inp.bottom, 112, tokens),
        Edge("q", q.cx, q.bottom, qk.top, heads, "Q"),
        Edge("k", k.cx, k.bottom, qk.top, heads, "K"),
        Edge("v", v.cx, v.bottom, av.top, heads, "V"),
        Edge("scores", main, qk.bottom, scale.top, scores, "scores"),
        Edge("scaled", main, scale.bottom, mask.top, scores, "scaled scores"),
        Edge("masked", main, mask.bottom, soft.top, scores),
        Edge("weights", main, soft.bottom, av.top, scores, "weights, rows sum to 1"),
        Edge("heads_out", av.cx, av.bottom, concat.top, heads),
        Edge("concat", concat.cx, concat.bottom, out_proj.top, tokens),
        Edge("output", out_proj.cx, out_proj.bottom, out.top, tokens),
    ]
    return boxes, edges


def attention_svg(config: ModelConfig, n_tokens: int | None = None) -> str:
    """The diagram as one ``<svg>`` element (UTF-8 text, no XML declaration).

    ``config`` needs ``d_model``, ``n_heads``, ``n_layers`` and ``patch_size``;
    ``n_tokens`` is the model's token count (None writes ``T``).
    """
    boxes, edges = layout(config, n_tokens)
    D, H, L = config.d_model, config.n_heads, config.n_layers
    T = "T" if n_tokens is None else str(n_tokens)
    height = 790
    title = "Multi-head self-attention in LocusFormer"
    sizes = (
        f"B samples · T = {T} tokens of {config.patch_size} loci · D = {D} · "
        f"H = {H} heads · d_k = {D // H} · {L} layer{'s' if L != 1 else ''}"
    )
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {WIDTH} {height}" '
        f'width="{WIDTH}" height="{height}" role="img" class="attention-flow" '
        f'data-d-model="{D}" data-heads="{H}" data-layers="{L}" data-tokens="{T}">',
        f"<title>{escape(title)}</title>",
        f"<desc>{escape(sizes)}</desc>",
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" '
        'markerWidth="7" markerHeight="7" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" fill="#333"/></marker></defs>',
        f'<rect x="0" y="0" width="{WIDTH}" height="{height}" fill="#fff"/>',
        _text(WIDTH / 2, 22, title, 15, bold=True),
        _text(WIDTH / 2, 41, sizes, 11.5),
        # the attention of one block, repeated in each of the n_layers blocks
        f'<rect x="20" y="48" width="{WIDTH - 40}" height="{height - 94}" rx="10" '
        'fill="none" stroke="#8a8a8a" stroke-dasharray="6 4"/>',
        _text(
            WIDTH / 2,
            height - 28,
            f"× {L}: each of the encoder's {L} blocks runs this on its own weights "
            "(x + attention(LN(x)), then x + MLP(LN(x)))",
            11.5,
        ),
        # the input's trunk splits to the three projections
        _line(150, 112, 470, 112),
        *(_arrow(x, 112, 134) for x in (150, 310, 470)),
    ]
    for box in boxes:
        out.append(_box(box))
    for edge in edges:
        # the input's arrow ends in the trunk's split, the others in a box
        if edge.name == "input":
            out.append(_line(edge.x, edge.y0, edge.x, edge.y1))
        else:
            out.append(_arrow(edge.x, edge.y0, edge.y1))
        label = edge.shape + (f" {edge.note}" if edge.note else "")
        out.append(
            f'<text class="shape" data-edge="{edge.name}" data-shape={quoteattr(edge.shape)} '
            f'x="{edge.x + 8:g}" y="{(edge.y0 + edge.y1) / 2 + 4:g}" font-size="11" '
            f'fill="#1f4e8c" style="{FONT}">{escape(label)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _text(x: float, y: float, text: str, size: float, bold: bool = False) -> str:
    weight = ' font-weight="bold"' if bold else ""
    return (
        f'<text x="{x:g}" y="{y:g}" font-size="{size:g}" text-anchor="middle"{weight} '
        f'fill="#222" style="{FONT}">{escape(text)}</text>'
    )


def _line(x0: float, y0: float, x1: float, y1: float) -> str:
    return f'<line x1="{x0:g}" y1="{y0:g}" x2="{x1:g}" y2="{y1:g}" stroke="#333"/>'


def _arrow(x: float, y0: float, y1: float) -> str:
    return (
        f'<line x1="{x:g}" y1="{y0:g}" x2="{x:g}" y2="{y1 - 1:g}" stroke="#333" '
        'marker-end="url(#arrow)"/>'
    )


def _box(box: Box) -> str:
    left = box.cx - box.width / 2
    dash = ' stroke-dasharray="5 3"' if box.dashed else ""
    fill = "#f7f7f7" if box.dashed else "#e8f0fa"
    parts = [
        f'<rect class="step" x="{left:g}" y="{box.top:g}" width="{box.width:g}" '
        f'height="{BOX_H}" rx="5" fill="{fill}" stroke="#36597f"{dash}/>',
        _text(box.cx, box.top + (14 if box.note else 21), box.text, 12.5, bold=True),
    ]
    if box.note:
        parts.append(_text(box.cx, box.top + 28, box.note, 10))
    return "".join(parts)


def readme_svg() -> str:
    """``docs/attention.svg``: the default configuration on the demo's token count."""
    from locusformer.model.config import ModelConfig

    return '<?xml version="1.0" encoding="UTF-8"?>\n' + attention_svg(ModelConfig(), DEMO_TOKENS)


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m locusformer.report.diagram OUT.svg``: write :func:`readme_svg` to OUT."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m locusformer.report.diagram OUT.svg", file=sys.stderr)
        return 2
    Path(args[0]).write_text(readme_svg(), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
