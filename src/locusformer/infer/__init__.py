"""Applying a trained model in memory: correction, mapping new batches, the attention trace."""
