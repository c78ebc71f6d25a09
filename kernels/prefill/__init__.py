"""The prompt's kernels (M > 1 tokens): tiled tl.dot matmuls with fused epilogues (tiles.py), the RMSNorm row
pre-pass, causal FlashAttention, and the launcher that skips triton's per-call Python work."""
