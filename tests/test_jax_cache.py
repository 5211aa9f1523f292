"""JAX's persistent compilation cache for the metrics step (scoring.neighbors)."""

from __future__ import annotations

import jax
import pytest

from locusformer.scoring.neighbors import cache_jax_compilation

OPTIONS = (
    "jax_compilation_cache_dir",
    "jax_persistent_cache_min_compile_time_secs",
    "jax_persistent_cache_min_entry_size_bytes",
)


@pytest.fixture(autouse=True)
def jax_options(monkeypatch):
    """No cache set at the start, and JAX's options and the once-per-process call restored
    after: other tests in this process compile with JAX's own settings."""
    saved = {name: getattr(jax.config, name) for name in OPTIONS}
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    jax.config.update("jax_compilation_cache_dir", None)
    # a value of the user's, which a kept cache must keep too
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 2.5)
    cache_jax_compilation.cache_clear()
    yield
    cache_jax_compilation.cache_clear()
    for name, value in saved.items():
        jax.config.update(name, value)


def test_the_cache_is_the_users_cache_folder_and_keeps_every_compilation(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    folder = cache_jax_compilation()
    assert folder == tmp_path / "locusformer" / "jax"
    assert folder.is_dir()
    assert jax.config.jax_compilation_cache_dir == str(folder)
    # JAX's default (1 s) would keep none of the metrics' compilations
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0
    assert jax.config.jax_persistent_cache_min_entry_size_bytes == 0


def test_without_xdg_cache_home_the_cache_is_under_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")  # invalid: ignored
    assert cache_jax_compilation() == tmp_path / ".cache" / "locusformer" / "jax"


def test_a_cache_the_user_set_in_the_environment_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "mine"))
    assert cache_jax_compilation() is None
    assert jax.config.jax_compilation_cache_dir is None  # JAX read it at import, not here
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.5
    assert not (tmp_path / "xdg").exists()


def test_a_cache_the_users_code_set_is_kept(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    jax.config.update("jax_compilation_cache_dir", str(tmp_path / "mine"))
    assert cache_jax_compilation() is None
    assert jax.config.jax_compilation_cache_dir == str(tmp_path / "mine")
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.5


def test_a_cache_folder_that_cannot_be_made_leaves_jax_as_it_was(tmp_path, monkeypatch):
    not_a_folder = tmp_path / "file"
    not_a_folder.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(not_a_folder))
    assert cache_jax_compilation() is None
    assert jax.config.jax_compilation_cache_dir is None
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 2.5
