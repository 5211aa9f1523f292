"""Synthetic multi-batch data with a known truth, and the genome it lies on."""
