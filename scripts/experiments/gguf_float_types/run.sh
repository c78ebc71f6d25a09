#!/usr/bin/env bash
# GGUF files whose weights are in types no kernel reads as blocks (Q5_0, IQ4_NL: small random models written by the
# tests' writer) decoded greedily on the GPU's triton backend and on the CPU's reference path, in fp32: the same
# tokens. Ran on one H200 at c9cd942 (run.txt); on the CPU the triton backend (interpreter) gave the same.
#   bash scripts/experiments/gguf_float_types/run.sh
. scripts/gpu_env.sh
python3 - <<'PY'
from pathlib import Path
from llamafast.config import ModelConfig
from tests.formats import meta_state
from tests.gguf_models.gguf_files import write_gguf
from tests.cli.bad_input_files import SMALL
c = ModelConfig(**{**SMALL, "multiple_of": 32})
for kind in ("Q5_0", "IQ4_NL"):
    write_gguf(Path(f"/tmp/{kind}.gguf"), c, meta_state(c), kind)
PY
for kind in Q5_0 IQ4_NL; do
  for where in "--device cuda --backend triton" "--device cpu --backend reference"; do
    python3 -m llamafast generate "Once upon a time" --model /tmp/$kind.gguf $where --dtype float32 --temperature 0 \
      --max-new-tokens 16 --json > /tmp/o.json 2>/tmp/e.txt
    echo "$kind [$where] exit $?: $(grep -v Warn /tmp/e.txt | head -2)"
    python3 -c "import json; d=json.load(open('/tmp/o.json')); print(d['token_ids'])"
  done
done
