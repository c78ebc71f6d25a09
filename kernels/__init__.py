"""Fused Triton kernels, installed as llamafast.kernels: one fused op per file, each with a torch reference
in llamafast/reference.py, a test in tests/kernels/ and an entry in REGISTRY for `llamafast bench --kernels`."""

REGISTRY: dict = {}
