"""Seconds to open and load the test data's SmolLM2-135M GGUF on the CPU (the aim: under 3 s), split into
Python imports, the header and tokenizer, and the dequantization and model build. Run it several times: the first
run after a change also compiles .pyc files.

    python scripts/gguf_load_time.py
"""

import time
t0 = time.perf_counter()
import torch
from pathlib import Path
from llamafast.load import load_model, open_model
t1 = time.perf_counter()
om = open_model(Path("../shared/testdata/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"))
t2 = time.perf_counter()
lm = load_model(om, device=torch.device("cpu"))
t3 = time.perf_counter()
print(f"imports {t1-t0:.2f} s; open (header, tokenizer) {t2-t1:.2f} s; load (dequantize, build) {t3-t2:.2f} s; "
      f"open + load {t3-t1:.2f} s")
