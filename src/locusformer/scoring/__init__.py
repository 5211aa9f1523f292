"""The scIB metrics, their neighbour graphs and subsample, and the design check."""
