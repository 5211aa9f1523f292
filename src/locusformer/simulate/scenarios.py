"""Designs that real studies have and CellBench lacks, simulated with the truth known.

A :class:`Scenario` fixes the design of a count data set: what the biology is (discrete
groups, graded mixtures of group programmes, a trajectory), how each batch's samples are
spread over it (balanced, skewed, some classes missing from some batches), how far batch
and biology are confounded, how strong the batch effect is next to the biology, and how
many samples, batches and genes there are. :func:`simulate_scenario` draws one data set of
it; :data:`SUITE` is the fixed grid of named scenarios that ``benchmarks/simulated/suite.py``
runs every corrector on, to choose defaults on more than one family of data (issue 38).

The genes, their base expression and dispersion, the group programmes and the batch
shift, scale, depth and dropout come from :func:`~locusformer.simulate.datasets.simulate_counts`;
the design (which batch, which class, which mixture or pseudotime each sample has) is drawn
here from a stream of its own, ``np.random.default_rng([seed, 38])``. Counts follow the
same negative-binomial and dropout model, drawn by
:meth:`~locusformer.simulate.datasets.CountSimulation.chunks` itself: for sample i of
batch b,

    mean[i, g] = base[g] * library[i] * depth[b] * exp(shift[b, g] + scale[b, g] * lfc[i, g])

where ``lfc[i] = w[i] @ programmes`` is the sample's log fold change, ``w[i]`` its weights
on the programmes (one-hot for a group, Dirichlet for a mixture, piecewise linear in the
pseudotime for a trajectory). The programmes are cut at +-3 and the batch log-scales at
2.5 sds (:data:`MAX_LOG_FOLD_CHANGE`), so that their product cannot blow a gene up.

Every scenario has a finite set of *classes*, the label a scorer uses: the groups, the
mixture design points, or five pseudotime stages. Composition and confounding act on the
classes, so "a group missing from a batch" means the same for all three biologies.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

import numpy as np
import pandas as pd
from scipy import sparse

from locusformer.errors import InputError
from locusformer.simulate.datasets import CountSimulation, simulate_counts
from locusformer.simulate.params import CountSimulationParams

Biology = Literal["groups", "mixtures", "trajectory"]
Composition = Literal["balanced", "skewed", "missing"]
Library = Literal["single_cell", "bulk", "shallow", "microarray"]

#: The design stream: ``default_rng([seed, DESIGN_STREAM])`` (the issue's number), apart
#: from the streams ``simulate_counts`` uses (0, 1, 2), so that the genes, programmes and
#: counts of a seed do not move when the design rules change.
DESIGN_STREAM = 38

#: CellBench's RNA-mixture design on three programmes: the pure ones, one dominant at 68%
#: (16% each other), and equal parts. A mixture's label is the nearest of these.
MIXTURE_DESIGN = np.array(
    [
        [1.0, 0.0, 0.0],
        [0.0, 1.0, 0.0],
        [0.0, 0.0, 1.0],
        [0.68, 0.16, 0.16],
        [0.16, 0.68, 0.16],
        [0.16, 0.16, 0.68],
        [1 / 3, 1 / 3, 1 / 3],
    ]
)
#: Dirichlet concentration of a mixture around its design point (``c * d + floor``): the
#: weights' sd is about 0.08 at 68%, well inside the distance to the next design point.
MIXTURE_CONCENTRATION = 30.0
MIXTURE_FLOOR = 0.3
#: Programmes of mixtures and trajectories (A, B, C).
N_PROGRAMMES = 3
#: Pseudotime stages: the trajectory's label is ``t`` binned in this many equal bins.
TRAJECTORY_STAGES = 5
#: A skewed batch's class shares fall by this factor from one class to the next (in an
#: order of the batch's own): 8:4:2:1 for four classes.
SKEW_RATIO = 0.5
#: A batch effect of strength 1 next to the group effect: shift sd = group_effect *
#: sqrt(programme_fraction), so that two batches' centroids lie as far apart (expected
#: squared distance over genes) as two groups' do; the scale and depth sds are fixed
#: shares of the same strength.
BATCH_SCALE_PER_STRENGTH = 0.15
BATCH_DEPTH_PER_STRENGTH = 0.5
#: The tails cut off: a programme's log fold change at +-3 (20-fold, a strong marker) and
#: a batch's log scale at 2.5 sds. Uncut, the scale times a rare 5-unit fold change made
#: a few genes of a strong batch a hundred thousand times their base (exp(20)), which
#: normalization then spreads over every other gene of those samples.
MAX_LOG_FOLD_CHANGE = 3.0
MAX_LOG_SCALE_SDS = 2.5
#: :meth:`Scenario.scaled` never goes below this many samples (the bulk-like size).
MIN_SCALED_SAMPLES = 40
#: Counts of a single-cell library: :class:`CountSimulationParams`' model, 7.4 times as
#: deep (about 1,500 counts a cell on 500 genes, against 95 at its defaults). At the
#: defaults the count noise hid the groups (bio 0.35 with no batch effect at all), and a
#: cell of a shallow batch under a strong depth effect could have no counts, which
#: normalization refuses (real data have such cells filtered out).
SINGLE_CELL_COUNTS = {"mean_log_expression": 0.0}
#: Share of the genes in each programme: twice ``simulate_counts``' 5%, for the same
#: reason (ten blocks of ten genes per programme on 1,000 genes).
PROGRAMME_FRACTION = 0.1
#: Counts of a bulk library: deep, little overdispersion, no dropout.
BULK_COUNTS = {"mean_log_expression": 3.0, "dispersion": 0.05, "dropout": 0.0, "library_sd": 0.2}
#: A shallow single-cell library: ``simulate_counts``' own depth and its 5% of the genes
#: in each programme, the data of ``locusformer simulate`` at its defaults (the scale
#: benchmark's). The biology is a small share of each cell's variance, so a corrector's
#: reconstruction barely needs it: there the input clusters folded the latent's axes
#: (docs/notes/2026-12-06.md).
SHALLOW_COUNTS: dict[str, float] = {}
SHALLOW_PROGRAMME_FRACTION = 0.05
#: A microarray-like study: the bulk library's counts read as log2 intensities,
#: ``log2(1e6 * count / library + background)`` plus a bias of each batch that bends with
#: the intensity and a measurement noise. The background floors the weak genes, as a
#: scanner's does; the bias is a polynomial in the centred intensity ``u``, ``offset +
#: slope * u + curvature * u**2 / 8`` (coefficients drawn per batch with these sds, times
#: the batch strength): arrays processed apart differ by such intensity-dependent curves,
#: which is why they are quantile- or loess-normalized, and a shift per gene, ComBat's
#: model, does not describe them.
MICROARRAY_BACKGROUND = 16.0
MICROARRAY_CENTRE = 8.0
MICROARRAY_BIAS_SDS = (0.5, 0.1, 0.1)
MICROARRAY_NOISE_SD = 0.2
#: The streams of the intensities' noise, ``default_rng([seed, MICROARRAY_STREAM])``, and
#: of each batch's bias, ``default_rng([seed, MICROARRAY_STREAM, 1])``.
MICROARRAY_STREAM = 40


@dataclass(frozen=True)
class Scenario:
    """The design of a simulated multi-batch data set.

    Parameters
    ----------
    biology
        ``"groups"``: ``n_groups`` discrete types, each with its own programme.
        ``"mixtures"``: each sample a graded mixture of three programmes, its log fold
        change ``w @ programmes`` with Dirichlet weights around one of
        :data:`MIXTURE_DESIGN`'s seven points; the label is the nearest design point (as
        CellBench's RNA mixtures). ``"trajectory"``: a pseudotime ``t`` in [0, 1] moving
        from programme A (t = 0) through B (0.5) to C (1); the label is ``t`` in
        :data:`TRAJECTORY_STAGES` equal bins.
    composition
        How each batch's samples spread over the classes. ``"balanced"``: equal shares.
        ``"skewed"``: every class in every batch, in shares falling by
        :data:`SKEW_RATIO` in an order of the batch's own. ``"missing"``: one class absent
        from each batch (never the batch's dominant one), every class still in at least
        two batches; the others in equal shares. Needs 3 batches or more.
    confounding
        In [0, 1]: the share of each batch's samples drawn from that batch's own dominant
        class (a different one per batch while there are classes enough); the rest follow
        ``composition``. 0: none; 1: the batch determines the label.
    batch_strength
        Multiplies the batch shift, scale, depth and the batches' differences in dropout;
        at 1 two batches' centroids lie about as far apart as two groups' (see
        :data:`BATCH_SCALE_PER_STRENGTH`). 0: no batch effect; 2: twice the biology.
    n_samples, n_batches, n_genes
        Batches are of equal size (within one sample).
    n_groups
        The groups of ``biology="groups"``; mixtures and trajectories have three
        programmes and 7 and 5 classes.
    library
        ``"single_cell"``: overdispersed counts with dropout, 7.4 times as deep as
        :class:`CountSimulationParams`' model (:data:`SINGLE_CELL_COUNTS`).
        ``"bulk"``: deep libraries, little overdispersion, no dropout (:data:`BULK_COUNTS`).
        ``"shallow"``: single-cell libraries at ``simulate_counts``' own depth, with half
        the genes in each programme (:data:`SHALLOW_COUNTS`,
        :data:`SHALLOW_PROGRAMME_FRACTION`).
        ``"microarray"``: the bulk library read as log2 intensities with a batch bias that
        bends with the intensity (:meth:`ScenarioSimulation.intensities`,
        :data:`MICROARRAY_BIAS_SDS`); handed to a corrector as log-expression.
    """

    biology: Biology = "groups"
    composition: Composition = "balanced"
    confounding: float = 0.0
    batch_strength: float = 1.0
    n_samples: int = 600
    n_batches: int = 4
    n_genes: int = 1000
    n_groups: int = 4
    library: Library = "single_cell"

    def __post_init__(self) -> None:
        for name, kind in (
            ("biology", Biology),
            ("composition", Composition),
            ("library", Library),
        ):
            if getattr(self, name) not in get_args(kind):
                raise InputError(f"scenario {name}", f"must be one of {get_args(kind)}")
        checks = {
            "confounding": 0.0 <= self.confounding <= 1.0,
            "batch_strength": self.batch_strength >= 0 and math.isfinite(self.batch_strength),
            "n_batches": self.n_batches >= 2,
            # Two samples a batch at least: ComBat and the scores need a spread per batch.
            "n_samples": self.n_samples >= 2 * self.n_batches,
            "n_genes": self.n_genes >= 10,
            "n_groups": self.n_groups >= 2,
        }
        for name, ok in checks.items():
            if not ok:
                raise InputError(f"scenario {name}", f"invalid value {getattr(self, name)!r}")
        if self.composition == "missing" and self.n_batches < 3:
            raise InputError(
                "scenario composition",
                "'missing' needs 3 batches or more: a class absent from one of two batches "
                "would be in one batch only",
            )

    @property
    def n_programmes(self) -> int:
        """Programmes drawn by ``simulate_counts``: the groups, or A, B and C."""
        return self.n_groups if self.biology == "groups" else N_PROGRAMMES

    @property
    def classes(self) -> list[str]:
        """The label values, in their natural order."""
        if self.biology == "groups":
            return [f"group{k + 1}" for k in range(self.n_groups)]
        if self.biology == "mixtures":
            return ["-".join(f"{round(100 * x)}" for x in row) for row in MIXTURE_DESIGN]
        return [f"stage{s + 1}" for s in range(TRAJECTORY_STAGES)]

    def scaled(
        self, size_scale: float, *, max_samples: int | None = None, n_genes: int | None = None
    ) -> Scenario:
        """The same design with ``n_samples`` times ``size_scale`` (for a quick run).

        Never below :data:`MIN_SCALED_SAMPLES` (or the scenario's own size when smaller:
        a bulk-like design stays bulk-like), nor below two samples a batch; at most
        ``max_samples`` when given. ``n_genes`` replaces the gene count.
        """
        if not size_scale > 0:
            raise InputError("size_scale", f"must be > 0, got {size_scale!r}")
        n = max(round(self.n_samples * size_scale), min(self.n_samples, MIN_SCALED_SAMPLES))
        if max_samples is not None:
            n = min(n, max_samples)
        n = max(n, 2 * self.n_batches)
        return dataclasses.replace(self, n_samples=n, n_genes=n_genes or self.n_genes)


@dataclass
class ScenarioSimulation(CountSimulation):
    """A :class:`CountSimulation` of a :class:`Scenario`, with its truth.

    ``effect`` holds each sample's own log fold change (n, G) and ``group_code`` is each
    sample's row of it (``arange(n)``), so that the inherited :meth:`chunks` draws the
    counts with the unchanged negative-binomial and dropout model. ``samples`` has
    ``sample_id``, ``batch`` and ``group`` (the label: a class of
    :attr:`Scenario.classes`, named ``group`` as the simulation's sample sheets are), and
    the continuous truth: ``weight_A`` .. ``weight_C`` for mixtures, ``pseudotime`` for a
    trajectory.
    """

    scenario: Scenario = field(default_factory=Scenario)
    label_code: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # (n,)
    programmes: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (P, G)
    weights: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))  # (n, P), rows sum 1
    pseudotime: np.ndarray | None = None  # (n,) for a trajectory
    # Batch name -> the classes composition="missing" took out of it, and each batch's
    # dominant class (the one confounding draws from).
    absent: dict[str, list[str]] = field(default_factory=dict)
    dominant: dict[str, str] = field(default_factory=dict)
    # (B, 3) each batch's intensity bias (offset, slope, curvature) of a microarray study.
    intensity_bias: np.ndarray | None = None

    @property
    def value_type(self) -> Literal["counts", "log_expression"]:
        """What :meth:`values` holds: counts, or a microarray study's log2 intensities."""
        return "log_expression" if self.intensity_bias is not None else "counts"

    def values(self) -> sparse.csr_matrix | np.ndarray:
        """The data a corrector is handed: :meth:`counts`, or :meth:`intensities` for a
        microarray study."""
        return self.counts() if self.intensity_bias is None else self.intensities()

    def intensities(self) -> np.ndarray:
        """Samples x genes float32 log2 intensities of a microarray study (``library``
        ``"microarray"``): each sample's counts per million on the log2 scale above
        :data:`MICROARRAY_BACKGROUND`, its batch's bias at that intensity added, and
        Gaussian noise of sd :data:`MICROARRAY_NOISE_SD` (the same seed, the same values).
        """
        if self.intensity_bias is None:
            raise InputError("intensities", "only a microarray scenario has intensities")
        counts = self.counts().toarray().astype(np.float64)
        library = np.maximum(counts.sum(axis=1, keepdims=True), 1.0)
        clean = np.log2(1e6 * counts / library + MICROARRAY_BACKGROUND)
        offset, slope, curvature = self.intensity_bias[self.batch_code].T[:, :, None]
        u = clean - MICROARRAY_CENTRE
        rng = np.random.default_rng([self.params.seed, MICROARRAY_STREAM])
        noise = rng.normal(0.0, MICROARRAY_NOISE_SD, size=clean.shape)
        return (clean + offset + slope * u + curvature * u * u / 8 + noise).astype(np.float32)

    @property
    def labels(self) -> np.ndarray:
        """(n,) the label of every sample (``samples["group"]``)."""
        return self.samples["group"].to_numpy()

    @property
    def batches(self) -> np.ndarray:
        """(n,) the batch of every sample."""
        return self.samples["batch"].to_numpy()

    def counts(self) -> sparse.csr_matrix:
        """Samples x genes float32 counts, as :meth:`chunks` draws them."""
        return sparse.vstack([block for _, block in self.chunks()], format="csr")

    def signal(self) -> np.ndarray:
        """(n, G) the batch-free log mean: ``log base + lfc`` (depth 1, no library noise)."""
        return self.log_base + self.effect

    def expected_log_mean(self) -> np.ndarray:
        """(n, G) the log mean with the batch effect, before library noise and counting."""
        b = self.batch_code
        return (
            self.log_base + self.shift[b] + self.scale[b] * self.effect + self.log_depth[b][:, None]
        )

    def truth(self) -> dict[str, Any]:
        """The scenario, parameters, batches and classes as plain JSON data."""
        s = self.scenario
        names = [f"batch{b + 1}" for b in range(s.n_batches)]
        classes = s.classes
        table = pd.crosstab(self.samples["batch"], self.samples["group"])
        return {
            "scenario": dataclasses.asdict(s),
            "params": dataclasses.asdict(self.params),
            "model": (
                "count ~ NB(base[g] * library[i] * depth[b] * exp(shift[b,g] + "
                "scale[b,g] * (w[i] @ programmes)[g]), dispersion[g]); dropout[b] / (1 + mean)"
            ),
            "value_type": self.value_type,
            "programmes": {
                name: self.genes.loc[self.programmes[p] != 0, "gene_id"].tolist()
                for p, name in enumerate(_programme_names(s))
            },
            "batches": {
                name: {
                    "n_samples": int((self.batch_code == b).sum()),
                    "depth": float(np.exp(self.log_depth[b])),
                    "dropout": float(self.dropout[b]),
                    "dominant": self.dominant[name],
                    "absent": self.absent.get(name, []),
                    "classes": {
                        c: int(table.loc[name, c])
                        for c in classes
                        if c in table.columns and name in table.index
                    },
                    **self._bias_of(b),
                }
                for b, name in enumerate(names)
            },
        }

    def _bias_of(self, b: int) -> dict[str, list[float]]:
        if self.intensity_bias is None:
            return {}
        return {"intensity_bias": [float(v) for v in self.intensity_bias[b]]}


def _programme_names(scenario: Scenario) -> list[str]:
    if scenario.biology == "groups":
        return scenario.classes
    return ["A", "B", "C"]


def simulate_scenario(
    scenario: Scenario, seed: int, annotation: str | None = None
) -> ScenarioSimulation:
    """Draw one data set of ``scenario``.

    Parameters
    ----------
    scenario
        The design.
    seed
        The same seed gives the same counts; genes, programmes and batch parameters come
        from ``simulate_counts`` with this seed, the design from
        ``default_rng([seed, DESIGN_STREAM])``.
    annotation
        Gene table to draw genes from (default: the bundled one; see
        :func:`~locusformer.simulate.datasets.simulate_counts`).

    Returns
    -------
    The simulation; ``counts()`` gives the matrix, ``samples`` the batch and label,
    ``weights`` / ``pseudotime`` the continuous truth, ``signal()`` the batch-free log mean.
    """
    s = scenario
    if seed < 0:
        raise InputError("seed", f"must be >= 0, got {seed!r}")
    params = _count_params(s, seed)
    base = simulate_counts(params, annotation=annotation)
    rng = np.random.default_rng([seed, DESIGN_STREAM])
    n, B = s.n_samples, s.n_batches
    classes = s.classes
    C = len(classes)

    # Batches of equal size, in a shuffled sample order (order must carry nothing).
    batch_code = np.repeat(np.arange(B), [n // B + (b < n % B) for b in range(B)])
    dominant = _dominant_classes(B, C, rng)
    absent = _absent_classes(dominant, C, rng) if s.composition == "missing" else {}
    shares = _shares(s, C, dominant, absent, rng)
    label_code = np.empty(n, dtype=np.int64)
    for b in range(B):
        rows = np.flatnonzero(batch_code == b)
        label_code[rows] = np.repeat(np.arange(C), _quota(len(rows), shares[b]))
    order = rng.permutation(n)
    batch_code, label_code = batch_code[order], label_code[order]

    weights, pseudotime = _biology(s, label_code, rng)
    programmes = np.clip(base.effect, -MAX_LOG_FOLD_CHANGE, MAX_LOG_FOLD_CHANGE)
    effect = weights @ programmes  # (n, G): each sample's log fold change
    bound = MAX_LOG_SCALE_SDS * params.batch_scale
    scale = np.exp(np.clip(np.log(base.scale), -bound, bound))

    # The batch effect at this strength: simulate_counts drew shift, scale and depth as
    # sd * N(0, 1) with the strength already in the sd, so the same seed gives the same
    # direction at every strength. Its dropout does not scale with a parameter: shrink the
    # batches' differences from the mean rate here (at 0 every batch drops alike).
    mean_dropout = params.dropout
    dropout = np.clip(mean_dropout + s.batch_strength * (base.dropout - mean_dropout), 0.0, 0.99)

    batch_names = [f"batch{b + 1}" for b in range(B)]
    width = len(str(n - 1))
    samples = pd.DataFrame(
        {
            "sample_id": [f"sample{i:0{width}d}" for i in range(n)],
            "batch": [batch_names[b] for b in batch_code],
            "group": [classes[c] for c in label_code],
        }
    )
    if s.biology == "mixtures":
        for p, name in enumerate(_programme_names(s)):
            samples[f"weight_{name}"] = weights[:, p]
    if pseudotime is not None:
        samples["pseudotime"] = pseudotime
    genes = base.genes.copy()
    names = _programme_names(s)
    genes["programme"] = [
        ",".join(names[p] for p in np.flatnonzero(programmes[:, g])) for g in range(len(genes))
    ]
    return ScenarioSimulation(
        params=params,
        genes=genes,
        samples=samples,
        log_base=base.log_base,
        dispersion=base.dispersion,
        effect=effect,
        shift=base.shift,
        scale=scale,
        log_depth=base.log_depth,
        dropout=dropout,
        batch_code=batch_code.astype(np.int64),
        group_code=np.arange(n, dtype=np.int64),
        scenario=s,
        label_code=label_code,
        programmes=programmes,
        weights=weights,
        pseudotime=pseudotime,
        absent={batch_names[b]: [classes[c] for c in cs] for b, cs in absent.items()},
        dominant={batch_names[b]: classes[c] for b, c in enumerate(dominant)},
        intensity_bias=_intensity_bias(s, seed),
    )


def _intensity_bias(s: Scenario, seed: int) -> np.ndarray | None:
    """(B, 3) each batch's offset, slope and curvature of a microarray study, else None;
    from a stream of its own, so the counts below do not move."""
    if s.library != "microarray":
        return None
    rng = np.random.default_rng([seed, MICROARRAY_STREAM, 1])
    return rng.normal(size=(s.n_batches, 3)) * np.array(MICROARRAY_BIAS_SDS) * s.batch_strength


def _count_params(s: Scenario, seed: int) -> CountSimulationParams:
    defaults = CountSimulationParams()
    library, fraction = {
        "single_cell": (SINGLE_CELL_COUNTS, PROGRAMME_FRACTION),
        "bulk": (BULK_COUNTS, PROGRAMME_FRACTION),
        "shallow": (SHALLOW_COUNTS, SHALLOW_PROGRAMME_FRACTION),
        "microarray": (BULK_COUNTS, PROGRAMME_FRACTION),
    }[s.library]
    unit_shift = defaults.group_effect * math.sqrt(fraction)
    return dataclasses.replace(
        defaults,
        programme_fraction=fraction,
        n_samples=s.n_samples,
        n_genes=s.n_genes,
        n_batches=s.n_batches,
        n_groups=s.n_programmes,
        batch_shift=s.batch_strength * unit_shift,
        batch_scale=s.batch_strength * BATCH_SCALE_PER_STRENGTH,
        batch_depth=s.batch_strength * BATCH_DEPTH_PER_STRENGTH,
        seed=seed,
        **library,
    )


def _dominant_classes(n_batches: int, n_classes: int, rng: np.random.Generator) -> np.ndarray:
    """Each batch's dominant class: all different while there are classes enough, then
    cycling through the same random order."""
    order = rng.permutation(n_classes)
    return order[np.arange(n_batches) % n_classes]


def _absent_classes(
    dominant: np.ndarray, n_classes: int, rng: np.random.Generator
) -> dict[int, list[int]]:
    """One class out of each batch, never its dominant one, every class left in two
    batches or more (a class in one batch only is confounded, not missing)."""
    n_batches = len(dominant)
    present = np.full(n_classes, n_batches)
    order = rng.permutation(n_classes)
    absent: dict[int, list[int]] = {}
    for b in range(n_batches):
        for offset in range(n_classes):
            c = int(order[(b + offset) % n_classes])
            if c != dominant[b] and present[c] > 2:
                absent[b] = [c]
                present[c] -= 1
                break
    return absent


def _shares(
    s: Scenario,
    n_classes: int,
    dominant: np.ndarray,
    absent: dict[int, list[int]],
    rng: np.random.Generator,
) -> np.ndarray:
    """(B, C) each batch's class shares: the composition, then confounding."""
    shares = np.ones((s.n_batches, n_classes))
    for b in range(s.n_batches):
        if s.composition == "skewed":
            shares[b, rng.permutation(n_classes)] = SKEW_RATIO ** np.arange(n_classes)
        shares[b, absent.get(b, [])] = 0.0
    shares /= shares.sum(axis=1, keepdims=True)
    own = np.zeros_like(shares)
    own[np.arange(s.n_batches), dominant] = 1.0
    return s.confounding * own + (1.0 - s.confounding) * shares


def _quota(n: int, shares: np.ndarray) -> np.ndarray:
    """``n`` split by ``shares`` with the largest remainders: exact, so that a share of 0
    is no sample and a share of 1 all of them (a random draw would blur the design)."""
    raw = n * shares
    counts = np.floor(raw).astype(np.int64)
    rest = n - counts.sum()
    counts[np.argsort(-(raw - counts), kind="stable")[:rest]] += 1
    return counts


def _biology(
    s: Scenario, label_code: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray | None]:
    """(n, P) programme weights of every sample and, for a trajectory, its pseudotime."""
    n = len(label_code)
    if s.biology == "groups":
        return np.eye(s.n_groups)[label_code], None
    if s.biology == "mixtures":
        design = MIXTURE_DESIGN[label_code]
        weights = np.empty((n, N_PROGRAMMES))
        # Redraw the few mixtures whose nearest design point is another class: the label
        # must be the nearest point *and* the class the design put there (a "missing"
        # class then stays missing).
        todo = np.arange(n)
        for _ in range(100):
            # Dirichlet rows with alphas of their own: normalized gammas.
            g = rng.gamma(MIXTURE_CONCENTRATION * design[todo] + MIXTURE_FLOOR)
            weights[todo] = g / g.sum(axis=1, keepdims=True)
            todo = todo[nearest_design(weights[todo]) != label_code[todo]]
            if not todo.size:
                break
        weights[todo] = design[todo]  # never in practice; a design point is its own nearest
        return weights, None
    width = 1.0 / TRAJECTORY_STAGES
    t = (label_code + rng.random(n)) * width
    return trajectory_weights(t), t


def nearest_design(weights: np.ndarray) -> np.ndarray:
    """(n,) the index of the :data:`MIXTURE_DESIGN` point nearest each row of weights."""
    distance = ((weights[:, None, :] - MIXTURE_DESIGN[None]) ** 2).sum(axis=2)
    return distance.argmin(axis=1)


def trajectory_weights(t: np.ndarray) -> np.ndarray:
    """(n, 3) weights of programmes A, B, C at pseudotime ``t``: A falls from 1 to 0 over
    the first half while B rises, then B falls while C rises."""
    t = np.asarray(t, dtype=np.float64)
    a = np.clip(1.0 - 2.0 * t, 0.0, 1.0)
    c = np.clip(2.0 * t - 1.0, 0.0, 1.0)
    return np.stack([a, 1.0 - a - c, c], axis=1)


def stage_of(t: np.ndarray) -> np.ndarray:
    """(n,) the pseudotime stage (0-based) of ``t``: the trajectory's label code."""
    return np.minimum((np.asarray(t) * TRAJECTORY_STAGES).astype(np.int64), TRAJECTORY_STAGES - 1)


# --------------------------------------------------------------------------------------
# The suite: one axis at a time around a middle scenario, plus the hard corners
# --------------------------------------------------------------------------------------

#: Four groups in four balanced batches of 150 samples, no confounding, a batch effect as
#: large as the biology: every axis of the suite moves away from here.
MIDDLE = Scenario()


def _around(**changes: Any) -> Scenario:
    return dataclasses.replace(MIDDLE, **changes)


SUITE: dict[str, Scenario] = {
    "middle": MIDDLE,
    # Biology.
    "mixtures": _around(biology="mixtures"),
    "trajectory": _around(biology="trajectory"),
    # Composition.
    "skewed": _around(composition="skewed"),
    "missing": _around(composition="missing"),
    # Confounding.
    "confounded-0.3": _around(confounding=0.3),
    "confounded-0.6": _around(confounding=0.6),
    "confounded-total": _around(confounding=1.0),
    # Batch strength (0: the control a corrector should leave alone).
    "no-batch": _around(batch_strength=0.0),
    "batch-0.25": _around(batch_strength=0.25),
    "batch-0.5": _around(batch_strength=0.5),
    "batch-2": _around(batch_strength=2.0),
    # Samples.
    "n-40": _around(n_samples=40),
    "n-150": _around(n_samples=150),
    "n-3000": _around(n_samples=3000),
    # Batches.
    "batches-2": _around(n_batches=2),
    "batches-6": _around(n_batches=6),
    "batches-10": _around(n_batches=10),
    # Hard corners: a batch effect that splits the biology it shares with other batches.
    "strong-mixtures": _around(biology="mixtures", batch_strength=2.0),
    "strong-trajectory": _around(biology="trajectory", batch_strength=2.0),
    "strong-missing": _around(composition="missing", batch_strength=2.0),
    "strong-confounded": _around(confounding=0.6, batch_strength=2.0),
    # Graded biology under a design that is not balanced.
    "mixtures-skewed": _around(biology="mixtures", composition="skewed"),
    "mixtures-confounded": _around(biology="mixtures", confounding=0.6),
    "trajectory-missing": _around(biology="trajectory", composition="missing"),
    "trajectory-confounded": _around(biology="trajectory", confounding=0.6),
    # Bulk-like studies: tens of deep libraries.
    "bulk-6-batches": _around(library="bulk", n_samples=40, n_batches=6),
    "bulk-confounded": _around(library="bulk", n_samples=40, confounding=0.8),
    # An atlas-like design: many batches, each its own mix, a strong effect.
    "atlas-10-batches": _around(
        n_samples=3000, n_batches=10, composition="skewed", batch_strength=2.0
    ),
}
