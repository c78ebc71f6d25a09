"""A GGUF file's weights on the GPU against its tensor bytes: the file's tensors as stored (the gguf package's
reader), then the model llamafast loads from it: the CUDA memory allocated once it is loaded (before any KV cache
or graph) and its tensors' bytes, whole and by part (the embedding table is dequantized to bf16 at load).

    PYTHONPATH=. python scripts/experiments/gguf_memory/gguf_memory.py FILE.gguf
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import torch
from gguf import GGUFReader

from llamafast.load import load_model


def main() -> None:
    path = Path(sys.argv[1])
    reader = GGUFReader(path)
    stored = Counter()
    for t in reader.tensors:
        stored["token_embd" if t.name.startswith("token_embd") else t.tensor_type.name] += int(t.n_bytes)
    file_tensors = sum(stored.values())
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    lm = load_model(path, device=torch.device("cuda"))
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated() - before
    seen, held = set(), Counter()
    for name, t in [*lm.model.named_parameters(), *lm.model.named_buffers()]:
        if t.device.type != "cuda" or t.data_ptr() in seen:
            continue
        seen.add(t.data_ptr())
        held["tok_embeddings" if name.startswith("tok_embeddings") else str(t.dtype)] += t.numel() * t.element_size()
    total = sum(held.values())
    print(f"{path.name}: {path.stat().st_size / 1e9:.3f} GB file, {file_tensors / 1e9:.3f} GB of tensors "
          f"({', '.join(f'{k} {v / 1e9:.3f}' for k, v in stored.most_common())})")
    print(f"loaded as {lm.weights} on {torch.cuda.get_device_name()}: {allocated / 1e9:.3f} GB allocated "
          f"({100 * (allocated / file_tensors - 1):+.1f}% of the file's tensors), peak "
          f"{(torch.cuda.max_memory_allocated() - before) / 1e9:.3f} GB")
    print(f"the model's tensors: {total / 1e9:.3f} GB ({100 * (total / file_tensors - 1):+.1f}%): "
          f"{', '.join(f'{k} {v / 1e9:.3f}' for k, v in held.most_common())}")


if __name__ == "__main__":
    main()
