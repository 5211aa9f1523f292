"""LocusFormer: batch-effect correction with self-attention over gene loci in genomic order."""

__version__ = "0.2.0"

#: The AnnData API (:mod:`locusformer.api`), imported when first used so that the CLI and
#: ``import locusformer`` stay light.
_API = ("fit", "map", "load", "save")


def __getattr__(name: str):
    if name in _API:
        from locusformer import api

        return getattr(api, name)
    raise AttributeError(f"module 'locusformer' has no attribute {name!r}")
