"""Settings of a count simulation (``locusformer simulate``), apart from the simulation.

Pure Python, so that building the command line (which makes one flag per setting) imports
no numpy or pandas: every step's process builds the parser.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Literal, get_args

from locusformer.errors import InputError

BatchEffect = Literal["gene", "regional", "both"]
RegionKind = Literal["segments", "arms"]


def check_regional(batch_effect: str, region_size: float, region_kind: str) -> None:
    if batch_effect not in get_args(BatchEffect):
        raise InputError("simulate batch_effect", f"must be one of {get_args(BatchEffect)}")
    if region_kind not in get_args(RegionKind):
        raise InputError("simulate region_kind", f"must be one of {get_args(RegionKind)}")
    if not region_size >= 1:
        raise InputError("simulate region_size", f"must be >= 1 locus, got {region_size!r}")


#: The largest log-mean the settings may reach (see CountSimulationParams.validate).
MAX_LOG_MEAN = 41.0


@dataclass
class CountSimulationParams:
    """Settings of :func:`simulate_counts`; every one is recorded with the output."""

    n_samples: int = field(default=1000, metadata={"help": "samples (cells)"})
    n_genes: int = field(default=2000, metadata={"help": "genes, drawn from the annotation"})
    n_batches: int = field(default=3, metadata={"help": "batches"})
    n_groups: int = field(
        default=5, metadata={"help": "cell groups (types), each with its own programme"}
    )
    mean_log_expression: float = field(
        default=-2.0, metadata={"help": "mean of log(base[g]) (counts per sample at depth 1)"}
    )
    sd_log_expression: float = field(default=1.5, metadata={"help": "sd of log(base[g])"})
    library_sd: float = field(
        default=0.3, metadata={"help": "sd of log(library[i]) within a batch"}
    )
    dispersion: float = field(
        default=0.2, metadata={"help": "median negative-binomial dispersion (var = m + d m^2)"}
    )
    programme_fraction: float = field(
        default=0.05, metadata={"help": "share of genes in each group's programme"}
    )
    block_size: int = field(
        default=10, metadata={"help": "programme genes come in genomic neighbourhoods of this many"}
    )
    group_effect: float = field(
        default=1.5, metadata={"help": "sd of a programme gene's log fold change"}
    )
    batch_depth: float = field(
        default=0.5, metadata={"help": "sd of log(depth[b]): batch-wide sequencing depth"}
    )
    batch_shift: float = field(
        default=0.5,
        metadata={"help": "sd of shift[b, g]: log fold change of a batch, per gene or segment"},
    )
    batch_scale: float = field(
        default=0.3,
        metadata={
            "help": "sd of log(scale[b, g]): batch scaling of group effects, per gene or segment"
        },
    )
    dropout: float = field(
        default=0.3,
        metadata={"help": "mean dropout rate of a batch at zero mean (0.5x to 1.5x by batch)"},
    )
    batch_effect: BatchEffect = field(
        default="gene",
        metadata={
            "help": "shift and scale per gene ('gene'), per segment of consecutive genes on "
            "one chromosome ('regional': position-dependent artefacts) or both added",
            "choices": get_args(BatchEffect),
        },
    )
    region_size: float = field(
        default=30.0, metadata={"help": "mean length of a regional segment, in genes"}
    )
    region_kind: RegionKind = field(
        default="segments",
        metadata={
            "help": "regional segments of about region_size genes, or 'arms': each "
            "chromosome cut in two between 30 and 70 percent of its genes",
            "choices": get_args(RegionKind),
        },
    )
    seed: int = field(default=0, metadata={"help": "one seed for everything drawn"})

    def validate(self) -> None:
        checks = {
            "n_samples": self.n_samples >= 2,
            "n_genes": self.n_genes >= 1,
            "n_batches": self.n_batches >= 1,
            "n_groups": self.n_groups >= 1,
            "sd_log_expression": self.sd_log_expression >= 0,
            "library_sd": self.library_sd >= 0,
            "dispersion": self.dispersion > 0,
            "programme_fraction": 0 <= self.programme_fraction <= 1,
            "block_size": self.block_size >= 1,
            "group_effect": self.group_effect >= 0,
            "batch_depth": self.batch_depth >= 0,
            "batch_shift": self.batch_shift >= 0,
            "batch_scale": self.batch_scale >= 0,
            "dropout": 0 <= self.dropout < 1,
            "seed": self.seed >= 0,
        }
        for field_ in dataclasses.fields(self):
            value = getattr(self, field_.name)
            if isinstance(value, float) and not math.isfinite(value):
                raise InputError(f"simulate {field_.name}", f"must be a finite number, got {value}")
        for name, ok in checks.items():
            if not ok:
                raise InputError(f"simulate {name}", f"invalid value {getattr(self, name)!r}")
        # exp() of the log-mean must stay a count numpy can draw (below about 1e18, e^41):
        # the log-mean these settings reach at four standard deviations of each draw.
        reach = (
            self.mean_log_expression
            + 4 * (self.sd_log_expression + self.library_sd + self.batch_depth + self.batch_shift)
            + 4 * self.group_effect * math.exp(4 * self.batch_scale)
        )
        if reach > MAX_LOG_MEAN:
            raise InputError(
                "simulate",
                f"settings reach log-means near {reach:.0f} (counts of e^{reach:.0f}): lower "
                "mean_log_expression, group_effect or the batch effects",
            )
        check_regional(self.batch_effect, self.region_size, self.region_kind)
