"""Preprocessing: normalization, the genomic order of loci, batches, principal components."""
