"""Property-based: whatever malformed matrix or sheet it is given, ``locusformer normalize``
either succeeds (and writes every output) or refuses with exactly one line and exit code 2,
writing nothing. It never ends in a traceback.

Examples are derandomized so CI is reproducible; ``HYPOTHESIS_PROFILE=explore`` draws new
ones on every run.
"""

from __future__ import annotations

import csv
import gzip
import os
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from robustness_cli import files_under, normalize

settings.register_profile(
    "ci",
    max_examples=50,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("explore", parent=settings.get_profile("ci"), derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

OUTPUTS = ["counts.parquet", "normalized.parquet", "samples.tsv", "stats.json"]

# Tokens that real files contain where a number or an id should be.
HOSTILE = [
    "", " ", "NA", "nan", "NaN", "null", "inf", "-inf", "-1", "1e400", "0x1A", "1,5", "1.5",
    "3.0", "1e3", "+2", '"', "'", '"quoted"', "\t", ",", "é", "细胞", "<b>x</b>", "\x00",
    "ENSG00000000001.2", "ensg00000000001", "s0", "=1+1", "\u200b", "\ufeff",
]  # fmt: skip
cell_text = st.one_of(
    st.sampled_from(HOSTILE),
    st.integers(-5, 10**7).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.text(max_size=6),
)


def _ids(prefix: str, n: int) -> list[str]:
    return [f"{prefix}{i}" for i in range(n)]


SAMPLES = _ids("s", 6)


@st.composite
def tables(draw, kind: str) -> tuple[str, list[list[str]]]:
    """A valid matrix or sheet as rows of strings, then a few of the mistakes users make."""
    if kind == "matrix":
        n_genes = draw(st.integers(2, 6))
        values = draw(
            st.lists(
                st.lists(st.integers(0, 50), min_size=len(SAMPLES), max_size=len(SAMPLES)),
                min_size=n_genes,
                max_size=n_genes,
            )
        )
        rows = [["gene", *SAMPLES]] + [
            [f"ENSG{g:011d}", *map(str, row)] for g, row in enumerate(values, start=1)
        ]
    else:
        batch = st.sampled_from(["a", "b", "1", "2.0", "<b>"])
        batches = draw(st.lists(batch, min_size=len(SAMPLES), max_size=len(SAMPLES)))
        label = st.sampled_from(["x", "y", "<i>z</i>", "a, b", 'say "hi"', "é"])
        rows = [["sample_id", "batch", "label"]] + [
            [s, b, draw(label)] for s, b in zip(SAMPLES, batches, strict=True)
        ]
    for _ in range(draw(st.integers(0, 2))):
        rows = _mutate(draw, rows)
    return draw(st.sampled_from([",", "\t"])), rows


def _mutate(draw, rows: list[list[str]]) -> list[list[str]]:
    rows = [list(r) for r in rows]
    i = draw(st.integers(0, len(rows) - 1))
    row = rows[i]
    j = draw(st.integers(0, max(len(row) - 1, 0)))
    kind = draw(
        st.sampled_from(
            ["cell", "drop_cell", "add_cell", "dup_row", "drop_row", "transpose", "dup_header"]
        )
    )
    if kind == "cell" and row:
        row[j] = draw(cell_text)
    elif kind == "drop_cell" and row:
        del row[j]
    elif kind == "add_cell":
        row.insert(j, draw(cell_text))
    elif kind == "dup_row":
        rows.insert(i, list(row))
    elif kind == "drop_row" and len(rows) > 1:
        del rows[i]
    elif kind == "transpose":
        width = max(len(r) for r in rows)
        padded = [r + [""] * (width - len(r)) for r in rows]
        rows = [list(col) for col in zip(*padded, strict=True)]
    elif kind == "dup_header" and len(rows[0]) > 2:
        rows[0][-1] = rows[0][1]
    return rows


@st.composite
def files(draw, kind: str) -> tuple[str, bytes]:
    """File name and bytes: a mutated table written with the usual accidents, or noise."""
    if draw(st.integers(0, 9)) == 0:
        return "x.csv", draw(st.binary(max_size=200))
    sep, rows = draw(tables(kind))
    quote = draw(st.booleans())

    def field(text: str) -> str:
        return '"' + text.replace('"', '""') + '"' if quote else text

    eol = draw(st.sampled_from(["\n", "\r\n", "\n", sep + "\n"]))
    text = "".join(sep.join(map(field, row)) + eol for row in rows)
    if draw(st.booleans()):
        text = "\ufeff" + text
    data = text.encode("utf-8", errors="surrogatepass")
    name = "x.csv" if sep == "," else "x.tsv"
    if kind == "matrix" and draw(st.booleans()):
        data, name = gzip.compress(data), name + ".gz"
    if draw(st.integers(0, 5)) == 0:  # a download or a copy cut short
        data = data[: draw(st.integers(0, len(data)))]
    return name, data


def _check(matrix: tuple[str, bytes], sheet: tuple[str, bytes], *extra: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        (tmp / "m").mkdir()
        (tmp / "s").mkdir()
        matrix_path = tmp / "m" / matrix[0]
        sheet_path = tmp / "s" / sheet[0]
        matrix_path.write_bytes(matrix[1])
        sheet_path.write_bytes(sheet[1])
        out = tmp / "out"
        code, lines = normalize(matrix_path, sheet_path, out, *extra)
        event(f"exit {code}: {lines[0].split(': ')[-1][:40] if lines else 'ok'}")
        if code == 0:
            assert lines == [], lines
            assert files_under(out) == sorted(OUTPUTS), "every output, no temporary file"
            normalized = pd.read_parquet(out / "normalized.parquet")
            assert np.isfinite(normalized.to_numpy()).all()
            samples = pd.read_csv(out / "samples.tsv", sep="\t", dtype=str, keep_default_na=False)
            assert samples["sample_id"].tolist() == normalized.index.tolist()
        else:
            assert code == 2, lines
            assert len(lines) == 1, lines
            assert lines[0].startswith("locusformer normalize: error: "), lines
            assert "Traceback" not in lines[0]
            assert files_under(out) == [], "a refused step writes nothing"


@given(files("matrix"), files("sheet"))
def test_normalize_on_malformed_matrices_and_sheets(matrix, sheet):
    _check(matrix, sheet, "--label-key", "label")


@given(files("matrix"))
def test_normalize_on_malformed_matrices_with_a_good_sheet(matrix):
    sheet = "sample_id,batch\n" + "".join(f"{s},{'ab'[i % 2]}\n" for i, s in enumerate(SAMPLES))
    _check(matrix, ("s.csv", sheet.encode()))


@given(files("sheet"))
def test_normalize_on_malformed_sheets_with_a_good_matrix(sheet):
    matrix = "gene," + ",".join(SAMPLES) + "\n"
    matrix += "".join(
        f"ENSG{g:011d}," + ",".join(str(g + i) for i in range(6)) + "\n" for g in range(1, 5)
    )
    _check(("m.csv", matrix.encode()), sheet, "--label-key", "label")


label_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    min_size=1,
    max_size=20,
).filter(lambda s: s.strip() != "")


@given(st.lists(label_text, min_size=2, max_size=4, unique=True))
def test_any_label_round_trips_but_its_surrounding_spaces(labels):
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        samples = _ids("s", 8)
        pd.DataFrame(
            {g: [i + j + 1 for j in range(8)] for i, g in enumerate(_ids("ENSG0000000000", 4))},
            index=samples,
        ).T.rename_axis("gene").to_csv(tmp / "m.csv")
        column = [labels[i % len(labels)] for i in range(8)]
        sheet = pd.DataFrame({"sample_id": samples, "batch": ["a", "b"] * 4, "label": column})
        sheet.to_csv(tmp / "s.csv", index=False, quoting=csv.QUOTE_ALL)  # any text, kept
        code, lines = normalize(tmp / "m.csv", tmp / "s.csv", tmp / "out", "--label-key", "label")
        assert code == 0, lines
        back = pd.read_csv(tmp / "out" / "samples.tsv", sep="\t", dtype=str, keep_default_na=False)
        # Every character kept but the spaces around a value (removed with a warning).
        assert back["label"].tolist() == [label.strip() for label in column]
