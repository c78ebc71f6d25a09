"""SmolLM2-135M-Instruct from the real GGUF on the GPU, triton backend: greedy tokens against transformers' fp32
golden (tests/data/golden_smollm2.json), in fp32 and in bf16.

    PYTHONPATH=. python scripts/smollm2_gpu.py PATH/SmolLM2-135M-Instruct.Q4_1.gguf
"""
import json, sys, time
from pathlib import Path
import torch
from llamafast.config import Backend, DType, SamplingConfig
from llamafast.generate import Engine, stream_tokens
from llamafast.load import load_model
gguf = Path(sys.argv[1])
golden = json.loads(Path("tests/data/golden_smollm2.json").read_text())
for dtype in (DType.float32, DType.bfloat16):
    t0 = time.perf_counter()
    lm = load_model(gguf, device=torch.device("cuda"), dtype=dtype, backend=Backend.triton)
    print(f"{dtype.value}: loaded in {time.perf_counter() - t0:.2f} s")
    for case in golden["greedy"]:
        ids, want = case["prompt_ids"], case["continuation_ids"]
        engine = Engine(lm.model, SamplingConfig(temperature=0), len(ids) + len(want), n_vocab=lm.tokenizer.vocab_size)
        got = list(stream_tokens(engine, ids, len(want)))
        same = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), len(want))
        print(f"  {case['prompt']!r}: {same} of {len(want)} greedy tokens equal transformers' fp32 before the first difference")
