"""The oracle for llamafast's GGUF support, made once with Hugging Face transformers (fp32, CPU) from the test
data's SmolLM2-135M-Instruct GGUF: greedy continuations, the tokenizer's ids for tricky strings, and the chat
template rendered by apply_chat_template. Writes tests/data/golden_smollm2.json, which tests/gguf_models/ and
`bash scripts/reproduce.sh smollm2` compare against; a new case there is added here and the file remade.

    pip install transformers accelerate gguf && python scripts/smollm2_golden.py [--gguf PATH]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = Path(__file__).resolve().parents[1]
GGUF = ROOT.parent / "shared" / "testdata" / "smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf"
PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
TRICKY = ["Hello world", " leading space", "two  spaces\tand a tab", "new\nlines\n\n", "emoji 🦙🔥 ok",
          "CJK 日本語の文章と中文", "digits 1234567890 and 3.14159", "<|im_start|>user\nhi<|im_end|>", "",
          "ümlaut café naïve", "   ", "a" * 40]
CHAT = [[{"role": "user", "content": "What is 2 + 2?"}],
        [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
         {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--gguf", type=Path, default=GGUF)
    p.add_argument("--new-tokens", type=int, default=32)
    a = p.parse_args()
    tok = AutoTokenizer.from_pretrained(a.gguf.parent, gguf_file=a.gguf.name)
    model = AutoModelForCausalLM.from_pretrained(a.gguf.parent, gguf_file=a.gguf.name, torch_dtype=torch.float32)
    greedy = []
    for prompt in PROMPTS:
        ids = tok(prompt, add_special_tokens=False).input_ids
        out = model.generate(torch.tensor([ids]), max_new_tokens=a.new_tokens, do_sample=False)
        greedy.append({"prompt": prompt, "prompt_ids": ids, "continuation_ids": out[0, len(ids):].tolist()})
    record = {
        "source": f"transformers {__import__('transformers').__version__}, fp32 on the CPU, from {a.gguf.name} "
                  "(scripts/smollm2_golden.py)",
        "greedy": greedy,
        "tokenizer": [{"text": t, "ids": tok(t, add_special_tokens=False).input_ids} for t in TRICKY],
        "chat": [{"messages": m, "text": tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True)}
                 for m in CHAT],
    }
    out = ROOT / "tests" / "data" / "golden_smollm2.json"
    out.write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
