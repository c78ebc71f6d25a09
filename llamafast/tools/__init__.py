"""Commands' work that turns one checkpoint into another or describes it, loading models to do so: FP8 conversion,
sparsification, info's description."""
