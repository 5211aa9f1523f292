from __future__ import annotations

import os

import pytest

from locusformer.io.atomic import atomic_path, write_text


def test_output_appears_only_on_success(tmp_path):
    target = tmp_path / "sub" / "out.txt"
    with pytest.raises(RuntimeError), atomic_path(target) as tmp:
        tmp.write_text("half")
        raise RuntimeError("killed half-way")
    assert not target.exists()
    assert list((tmp_path / "sub").iterdir()) == [], "no temporary file left behind"
    write_text(target, "done")
    assert target.read_text() == "done"


def test_outputs_get_the_usual_permissions(tmp_path):
    umask = os.umask(0o022)
    try:
        write_text(tmp_path / "out.txt", "x")
    finally:
        os.umask(umask)
    assert (tmp_path / "out.txt").stat().st_mode & 0o777 == 0o644
