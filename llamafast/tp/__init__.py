"""Tensor parallelism under torchrun: the ranks' setup and their communication (each rank's weight slices load
through load/shard.py)."""
