"""The trained model on disk: a network and the record of how it was made.

A trained model is its network (:class:`~locusformer.model.network.LocusFormer`, weights only)
and a :class:`ModelRecord`: the batch names, the loci in token order, the seed, the
normalization its input had and the versions that made it, everything needed to prepare
new data the way the training data was prepared, without the training data. Together
they are a :class:`TrainedModel`, which :func:`save_model` writes and :func:`load_model`
reads (scvi-tools splits its models the same way: module, training plan, save/load).
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

import locusformer
from locusformer.errors import InputError
from locusformer.io import atomic
from locusformer.model.config import ModelConfig
from locusformer.model.network import LocusFormer

WEIGHTS_FORMAT = 1


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


def save_atomic(payload: Any, path: str | os.PathLike) -> None:
    """``torch.save`` under :func:`~locusformer.io.atomic.atomic_path`.

    torch's zip writer reports a full disk as a ``RuntimeError`` ("PytorchStreamWriter
    failed writing file ...: file write failed"), not an ``OSError``; it becomes the same
    :class:`~locusformer.io.atomic.WriteError` naming ``path`` that every other writer raises.
    """
    with atomic.atomic_path(path) as tmp, open(tmp, "wb") as fh:
        try:
            # To an open file, not a path: torch names the zip's entries after a path's
            # file name (here a random temporary one), and after nothing for a file, so
            # equal payloads give byte-identical files and a checksum identifies a model.
            torch.save(payload, fh)
        except RuntimeError as err:
            reason = _TORCH_ENFORCE.sub("", " ".join(str(err).split())) or type(err).__name__
            if "unexpected pos" in reason:  # the zip writer's words for a short write
                reason = f"the file could not be written whole (is the disk full?): {reason}"
            raise OSError(errno.EIO, reason, str(tmp)) from err


def versions() -> dict[str, str]:
    """The versions that made a model, recorded beside it."""
    return {"locusformer": locusformer.__version__, "torch": torch.__version__}


@dataclass
class ModelRecord:
    """What a trained model carries beside its weights.

    ``batch_names[i]`` is batch code ``i`` of the network. ``gene_ids`` and ``loci`` are
    the model's loci in token order. ``normalization`` is how its input was prepared
    (the normalize step's settings and the highly variable genes it kept), when known.
    """

    batch_names: list[str]
    gene_ids: list[str] | None = None
    loci: pd.DataFrame | None = None
    seed: int | None = None
    normalization: dict[str, Any] | None = None
    # Sample-sheet columns whose biology training kept (batch removed within their
    # levels); reports mark such a model as one that used labels.
    protect: list[str] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=versions)

    def __post_init__(self) -> None:
        self.batch_names = [str(b) for b in self.batch_names]
        if len(set(self.batch_names)) != len(self.batch_names):
            raise ValueError("batch names must be unique")
        if self.gene_ids is not None:
            self.gene_ids = [str(g) for g in self.gene_ids]


@dataclass
class TrainedModel:
    """A trained network and its :class:`ModelRecord`."""

    module: LocusFormer
    record: ModelRecord

    def __repr__(self) -> str:
        return (
            f"TrainedModel({self.n_loci} loci, {self.n_tokens} tokens, "
            f"batches {self.batch_names}, seed {self.seed})"
        )

    def __post_init__(self) -> None:
        if len(self.record.batch_names) != self.module.n_batches:
            raise ValueError(
                f"{len(self.record.batch_names)} batch names for {self.module.n_batches} batches"
            )
        if self.record.gene_ids is not None and len(self.record.gene_ids) != self.module.n_loci:
            raise ValueError(f"{len(self.record.gene_ids)} gene ids for {self.module.n_loci} loci")

    @property
    def config(self) -> ModelConfig:
        return self.module.config

    @property
    def batch_names(self) -> list[str]:
        return self.record.batch_names

    @property
    def gene_ids(self) -> list[str] | None:
        return self.record.gene_ids

    @property
    def loci(self) -> pd.DataFrame | None:
        return self.record.loci

    @property
    def seed(self) -> int | None:
        return self.record.seed

    @property
    def n_loci(self) -> int:
        return self.module.n_loci

    @property
    def n_batches(self) -> int:
        return self.module.n_batches

    @property
    def n_tokens(self) -> int:
        return self.module.n_tokens

    def to(self, device: str | torch.device) -> TrainedModel:
        self.module.to(device)
        return self

    def eval(self) -> TrainedModel:
        self.module.eval()
        return self


def read_normalization(path: str | os.PathLike | None) -> dict[str, Any] | None:
    """How the normalize step prepared the training data, from its stats JSON."""
    if path is None:
        return None
    try:
        stats = json.loads(Path(path).read_text(encoding="utf-8"))
        params = stats["params"]
        return {
            "value_type": str(stats["value_type"]),
            "target_sum": float(params["target_sum"]),
            "min_samples": int(params["min_samples"]),
            "n_top_genes": int(params["n_top_genes"]),
        }
    except FileNotFoundError:
        raise InputError(path, "file not found") from None
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise InputError(path, f"not a normalize stats file ({err})") from None


def save_model(
    model: TrainedModel, weights_path: str | os.PathLike, config_path: str | os.PathLike
) -> None:
    """Write weights (torch.save of tensors, names and the loci table) and a JSON config.

    Both writes are atomic. The JSON holds the record in plain words (architecture, batch
    names, seed, normalization, versions); the weights file holds the tensors and the
    loci table, which correction needs to rebuild the AnnData ``var``.
    """
    record = model.record
    payload: dict[str, Any] = {
        "format": WEIGHTS_FORMAT,
        "state_dict": cpu_state(model.module),
        "batch_names": list(record.batch_names),
        "gene_ids": list(record.gene_ids) if record.gene_ids is not None else None,
        "loci": _loci_to_plain(record.loci) if record.loci is not None else None,
    }
    config = {
        "model_config": model.config.to_dict(),
        "batch_names": list(record.batch_names),
        "n_loci": model.n_loci,
        "n_tokens": model.n_tokens,
        "locusformer_version": record.versions.get("locusformer"),
        "torch_version": record.versions.get("torch"),
        "seed": record.seed,
        "normalization": record.normalization,
        "protect": list(record.protect),
    }
    save_atomic(payload, weights_path)
    atomic.write_text(config_path, json.dumps(config, indent=2) + "\n")


def load_model(weights_path: str | os.PathLike, config_path: str | os.PathLike) -> TrainedModel:
    """Load what :func:`save_model` wrote, on CPU, in eval mode.

    The weights are read with ``torch.load(weights_only=True)``: a file that would run
    code when unpickled is refused with an :class:`InputError`.
    """
    try:
        config = json.loads(Path(config_path).read_text(encoding="utf-8"))
        model_config = ModelConfig.from_dict(config["model_config"])
    except FileNotFoundError:
        raise InputError(config_path, "model config not found") from None
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise InputError(config_path, f"not a LocusFormer model config ({err})") from None
    try:
        payload = torch.load(weights_path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError(weights_path, "model weights not found") from None
    except pickle.UnpicklingError as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(
            weights_path,
            f"refused to load: the file holds objects other than tensors and plain data, "
            f"which could run code ({first[:120]})",
        ) from None
    except Exception as err:
        raise InputError(
            weights_path, f"cannot read model weights ({type(err).__name__}: {err})"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != WEIGHTS_FORMAT:
        raise InputError(weights_path, "not a LocusFormer weights file")
    if payload["batch_names"] != config.get("batch_names"):
        raise InputError(config_path, f"batch names do not match {weights_path}")
    _check_made_by_this_version(config, config_path)
    gene_ids = payload.get("gene_ids")
    if gene_ids is not None and config.get("n_loci") not in (None, len(gene_ids)):
        raise InputError(
            config_path,
            f"says {config['n_loci']} loci, but {weights_path} holds {len(gene_ids)}: "
            "the two files are not of one model",
        )
    try:
        record = ModelRecord(
            batch_names=payload["batch_names"],
            gene_ids=payload["gene_ids"],
            loci=_loci_from_plain(payload.get("loci")),
            seed=config.get("seed"),
            normalization=config.get("normalization"),
            protect=list(config.get("protect") or []),
            versions={
                "locusformer": config.get("locusformer_version"),
                "torch": config.get("torch_version"),
            },
        )
        module = LocusFormer.from_state_dict(
            model_config, payload["state_dict"], len(record.batch_names)
        )
        model = TrainedModel(module, record)
    except (KeyError, RuntimeError, ValueError, TypeError) as err:
        raise InputError(weights_path, f"weights do not match {config_path} ({err})") from None
    return model.eval()


def _release(version: str) -> tuple[int, ...]:
    """``"0.2.0"`` -> ``(0, 2, 0)``; a part that does not start with digits ends it."""
    parts = []
    for part in str(version).split("."):
        digits = re.match(r"\d+", part)
        if digits is None:
            break
        parts.append(int(digits.group()))
    return tuple(parts)


def _check_made_by_this_version(config: Mapping[str, Any], config_path: Any) -> None:
    """Refuse a model written by a newer release than this one: its files may hold what
    this release cannot read, and would be read wrong without a word."""
    made_by = config.get("locusformer_version")
    if made_by is None:
        return
    if not isinstance(made_by, str) or not _release(made_by):
        raise InputError(config_path, f"locusformer_version {made_by!r} is not a version")
    if _release(made_by)[:2] > _release(locusformer.__version__)[:2]:
        raise InputError(
            config_path,
            f"written by locusformer {made_by}, newer than this {locusformer.__version__}; "
            "upgrade locusformer to load it",
        )


def _loci_to_plain(loci: pd.DataFrame) -> dict[str, list]:
    """Loci table -> dict of lists of str/int/bool/None (allowed by weights_only)."""
    out: dict[str, list] = {}
    for col in loci.columns:
        values = loci[col].astype(object).where(loci[col].notna(), None).tolist()
        out[str(col)] = [v.item() if isinstance(v, np.generic) else v for v in values]
    return out


def _loci_from_plain(data: Mapping[str, list] | None) -> pd.DataFrame | None:
    if data is None:
        return None
    frame = pd.DataFrame(dict(data))
    for col in ("start", "end", "position"):
        if col in frame.columns:
            frame[col] = pd.array(frame[col].tolist(), dtype="Int64")
    if "position" in frame.columns and not frame["position"].isna().any():
        frame["position"] = frame["position"].astype("int64")
    if "placed" in frame.columns:
        frame["placed"] = frame["placed"].astype(bool)
    if "chrom" in frame.columns:
        frame["chrom"] = frame["chrom"].fillna("").astype(str)
    return frame


_TORCH_ENFORCE = re.compile(r"\[enforce fail at [^\]]*\]\s*\.?\s*")
