# After `snakemake --sdm conda` builds the env of the same name (sh, in that env): the
# locusformer package of this release, without its dependencies, which the env already
# lists as far as its rules import them (pinned to requirements.lock's versions). In a
# deployment (no src/ beside the workflow) the rules run this package; from a clone they
# run the checkout's own src/ (LOCUSFORMER_SRC, on each command's PYTHONPATH), so there a
# failed install (an unreleased version, no index) is not an error. tests/test_envs.py
# checks that the version is pyproject.toml's.
python -m pip install --no-deps --disable-pip-version-check "locusformer==0.2.0" \
    || [ -n "${LOCUSFORMER_SRC:-}" ]
