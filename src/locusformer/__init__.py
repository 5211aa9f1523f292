"""LocusFormer: batch-effect correction with self-attention over gene loci in genomic order."""

__version__ = "0.1.0"
