"""The simulated suite's scenarios: the designs they promise, with the truth they return."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pandas as pd
import pytest

from locusformer.errors import InputError
from locusformer.simulate.scenarios import (
    MICROARRAY_BACKGROUND,
    MICROARRAY_CENTRE,
    MICROARRAY_NOISE_SD,
    MIXTURE_DESIGN,
    SUITE,
    TRAJECTORY_STAGES,
    Scenario,
    nearest_design,
    simulate_scenario,
    stage_of,
    trajectory_weights,
)


def small(scenario: Scenario, n: int = 80) -> Scenario:
    """The scenario at test size: at most ``n`` samples (bulk-like ones keep 40), 120 genes."""
    return scenario.scaled(0.1, max_samples=n, n_genes=120)


def crosstab(sim) -> pd.DataFrame:
    return pd.crosstab(sim.samples["batch"], sim.samples["group"])


def test_the_suite_covers_every_axis():
    assert len(SUITE) >= 24
    values = {
        f.name: {getattr(s, f.name) for s in SUITE.values()} for f in dataclasses.fields(Scenario)
    }
    assert values["biology"] == {"groups", "mixtures", "trajectory"}
    assert values["composition"] == {"balanced", "skewed", "missing"}
    assert {0.0, 1.0} <= values["confounding"] and len(values["confounding"]) >= 4
    assert {0.25, 2.0} <= values["batch_strength"]
    assert {40, 3000} <= values["n_samples"] and {2, 10} <= values["n_batches"]
    # The hard corners are there.
    corners = [
        s
        for s in SUITE.values()
        if s.batch_strength >= 2 and (s.biology == "mixtures" or s.composition == "missing")
    ]
    assert len(corners) >= 2
    assert any(s.n_samples <= 40 and s.n_batches >= 6 for s in SUITE.values())


@pytest.mark.parametrize("name", list(SUITE))
def test_every_scenario_simulates_with_its_truth(name):
    scenario = small(SUITE[name])
    sim = simulate_scenario(scenario, seed=0)
    X = sim.counts().toarray()
    n, G = scenario.n_samples, scenario.n_genes
    assert X.shape == (n, G) and (X >= 0).all() and np.array_equal(X, np.round(X))
    assert (X.sum(axis=1) > 0).all()
    samples = sim.samples
    assert len(samples) == n and samples["sample_id"].is_unique
    assert set(samples["batch"]) == {f"batch{b + 1}" for b in range(scenario.n_batches)}
    assert set(samples["group"]) <= set(scenario.classes)
    # Batches of equal size within one sample; labels as the codes say.
    sizes = samples["batch"].value_counts()
    assert sizes.max() - sizes.min() <= 1
    assert (np.array(scenario.classes)[sim.label_code] == sim.labels).all()
    assert np.allclose(sim.weights.sum(axis=1), 1.0) and (sim.weights >= 0).all()
    assert sim.signal().shape == sim.expected_log_mean().shape == (n, G)
    truth = sim.truth()
    assert sum(b["n_samples"] for b in truth["batches"].values()) == n
    assert truth["scenario"] == dataclasses.asdict(scenario)


def test_balanced_batches_hold_every_class_alike():
    sim = simulate_scenario(small(SUITE["middle"]), seed=1)
    table = crosstab(sim)
    assert table.shape == (4, 4)
    assert (table.max(axis=1) - table.min(axis=1) <= 1).all()


def test_skewed_batches_hold_every_class_in_shares_of_their_own():
    sim = simulate_scenario(SUITE["skewed"].scaled(1.0, max_samples=400, n_genes=60), seed=0)
    table = crosstab(sim)
    assert (table > 0).all().all()
    shares = table.div(table.sum(axis=1), axis=0)
    # Each batch's largest class holds about half its samples (8:4:2:1), and the batches
    # do not all favour the same class.
    assert (shares.max(axis=1) > 0.45).all()
    assert table.idxmax(axis=1).nunique() > 1


@pytest.mark.parametrize("name", [n for n, s in SUITE.items() if s.composition == "missing"])
def test_missing_classes_are_missing_from_the_named_batches_only(name):
    scenario = small(SUITE[name])
    sim = simulate_scenario(scenario, seed=2)
    table = crosstab(sim).reindex(columns=scenario.classes, fill_value=0)
    assert sim.absent, "a missing design takes classes out"
    for batch, classes in sim.absent.items():
        assert classes and (table.loc[batch, classes] == 0).all()
        assert sim.dominant[batch] not in classes
    # Every class is still in at least two batches, and absent only where named.
    assert ((table > 0).sum(axis=0) >= 2).all()
    for batch in table.index:
        empty = set(table.columns[table.loc[batch] == 0])
        assert empty == set(sim.absent.get(batch, []))


def test_total_confounding_makes_the_batch_determine_the_label():
    sim = simulate_scenario(small(SUITE["confounded-total"]), seed=0)
    table = crosstab(sim)
    assert ((table > 0).sum(axis=1) == 1).all()
    assert all(table.loc[b].idxmax() == sim.dominant[b] for b in table.index)
    # Each batch its own class: four batches, four groups.
    assert table.idxmax(axis=1).nunique() == 4


def test_partial_confounding_gives_each_batch_its_dominant_share():
    scenario = SUITE["confounded-0.6"].scaled(1.0, max_samples=200, n_genes=60)
    sim = simulate_scenario(scenario, seed=3)
    table = crosstab(sim)
    shares = table.div(table.sum(axis=1), axis=0)
    for batch in table.index:
        # 0.6 from the dominant, plus its quarter of the balanced rest.
        assert shares.loc[batch, sim.dominant[batch]] == pytest.approx(0.7, abs=0.03)


def test_mixtures_are_graded_and_labelled_by_their_nearest_design_point():
    sim = simulate_scenario(small(SUITE["mixtures"], n=140), seed=0)
    w = sim.samples[["weight_A", "weight_B", "weight_C"]].to_numpy()
    assert np.allclose(w.sum(axis=1), 1.0)
    assert np.array_equal(w, sim.weights)
    assert np.array_equal(nearest_design(w), sim.label_code)
    # Graded: mixtures are not their design points, and every design point is used.
    assert np.abs(w - MIXTURE_DESIGN[sim.label_code]).max() > 0.01
    assert set(sim.label_code) == set(range(len(MIXTURE_DESIGN)))
    # The log fold change is the weighted sum of the programmes.
    assert np.allclose(sim.effect, w @ sim.programmes)


def test_trajectory_labels_are_ordered_by_pseudotime():
    sim = simulate_scenario(small(SUITE["trajectory"]), seed=0)
    t = sim.samples["pseudotime"].to_numpy()
    assert ((t >= 0) & (t <= 1)).all()
    assert np.array_equal(stage_of(t), sim.label_code)
    stages = sorted(set(sim.label_code))
    assert stages == list(range(TRAJECTORY_STAGES))
    for a, b in itertools.pairwise(stages):
        assert t[sim.label_code == a].max() <= t[sim.label_code == b].min()
    assert np.allclose(sim.weights, trajectory_weights(t))
    # From A through B to C.
    assert np.allclose(trajectory_weights(np.array([0.0, 0.5, 1.0])), np.eye(3))


def test_strength_zero_leaves_no_batch_effect_in_the_expected_log_mean():
    sim = simulate_scenario(small(SUITE["no-batch"]), seed=0)
    assert np.array_equal(sim.expected_log_mean(), sim.signal())
    assert (sim.shift == 0).all() and (sim.scale == 1).all() and (sim.log_depth == 0).all()
    assert np.ptp(sim.dropout) == 0
    # The same seed at strength 1 moves the batches apart, in the same design.
    strong = simulate_scenario(dataclasses.replace(small(SUITE["no-batch"]), batch_strength=1.0), 0)
    assert np.array_equal(strong.signal(), sim.signal())
    assert np.abs(strong.expected_log_mean() - strong.signal()).mean() > 0.2


def test_the_same_seed_gives_the_same_counts_and_another_seed_others():
    scenario = small(SUITE["strong-mixtures"])
    a, b, c = (simulate_scenario(scenario, seed) for seed in (4, 4, 5))
    assert np.array_equal(a.counts().toarray(), b.counts().toarray())
    pd.testing.assert_frame_equal(a.samples, b.samples)
    assert not np.array_equal(a.counts().toarray(), c.counts().toarray())
    assert not a.samples.equals(c.samples)


def test_a_shallow_library_draws_fewer_counts_and_weaker_programmes_in_the_same_design():
    deep = SUITE["middle"].scaled(0.1, max_samples=200, n_genes=400)
    shallow = dataclasses.replace(deep, library="shallow")
    a, b = simulate_scenario(deep, seed=0), simulate_scenario(shallow, seed=0)
    pd.testing.assert_frame_equal(a.samples, b.samples)  # the design's stream is its own
    depth_a, depth_b = (sim.counts().sum(axis=1).mean() for sim in (a, b))
    assert depth_b < depth_a / 3
    # Half the genes in each programme: fewer genes tell the groups apart.
    programme_genes = [(sim.programmes != 0).sum() for sim in (a, b)]
    assert programme_genes[1] < programme_genes[0]


def test_a_microarray_study_reads_the_bulk_counts_as_intensities_bent_by_each_batch():
    bulk = small(SUITE["bulk-6-batches"])
    array = dataclasses.replace(bulk, library="microarray")
    a, b = simulate_scenario(bulk, seed=3), simulate_scenario(array, seed=3)
    assert (a.value_type, b.value_type) == ("counts", "log_expression")
    assert a.intensity_bias is None and b.intensity_bias.shape == (bulk.n_batches, 3)
    counts = b.counts().toarray().astype(np.float64)
    assert np.array_equal(counts, a.counts().toarray())  # the same study, read another way
    values = b.values()
    assert np.array_equal(values, b.intensities()) and values.dtype == np.float32
    clean = np.log2(1e6 * counts / counts.sum(axis=1, keepdims=True) + MICROARRAY_BACKGROUND)
    # What each batch adds is its own curve in the intensity, not one shift: fitting the
    # difference by a quadratic in the centred intensity gives back the drawn bias, and the
    # residual is the measurement noise.
    u = clean - MICROARRAY_CENTRE
    for batch in range(bulk.n_batches):
        rows = b.batch_code == batch
        design = np.stack(
            [np.ones(rows.sum() * u.shape[1]), u[rows].ravel(), u[rows].ravel() ** 2 / 8], 1
        )
        fit, *_ = np.linalg.lstsq(design, (values[rows] - clean[rows]).ravel(), rcond=None)
        np.testing.assert_allclose(fit, b.intensity_bias[batch], atol=0.03)
        residual = (values[rows] - clean[rows]).ravel() - design @ fit
        assert abs(residual.std() - MICROARRAY_NOISE_SD) < 0.02
    assert b.truth()["value_type"] == "log_expression"
    assert len(b.truth()["batches"]["batch1"]["intensity_bias"]) == 3
    # No batch effect, no bias; and a count study has no intensities.
    none = simulate_scenario(dataclasses.replace(array, batch_strength=0.0), seed=3)
    assert (none.intensity_bias == 0).all()
    with pytest.raises(InputError, match="intensities"):
        a.intensities()


def test_scaling_shrinks_the_samples_but_keeps_bulk_designs_bulk_like():
    assert SUITE["n-3000"].scaled(0.1).n_samples == 300
    assert SUITE["middle"].scaled(0.5, max_samples=100, n_genes=500).n_samples == 100
    assert SUITE["middle"].scaled(0.5, n_genes=500).n_genes == 500
    assert SUITE["bulk-6-batches"].scaled(0.1).n_samples == 40
    assert SUITE["batches-10"].scaled(0.01, max_samples=5).n_samples == 20  # 2 a batch


@pytest.mark.parametrize(
    "changes",
    [
        {"biology": "cells"},
        {"confounding": 1.5},
        {"batch_strength": -1.0},
        {"n_batches": 1},
        {"n_samples": 5, "n_batches": 3},
        {"composition": "missing", "n_batches": 2},
    ],
)
def test_impossible_designs_are_refused(changes):
    with pytest.raises(InputError):
        Scenario(**changes)
