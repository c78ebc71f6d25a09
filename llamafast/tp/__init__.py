"""Tensor parallelism under torchrun: sharded loading (shard.py), the ranks' setup and their communication."""
