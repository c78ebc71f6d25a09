"""`llamafast serve` under a streaming client, against `llamafast generate` on the same model and GPU in the same
call: the figures docs/benchmarks.md cites for the server.

1. decode tokens/s: `generate --json`'s decode_tokens_per_s, then the same prompt streamed from the server
   (greedy, the same new tokens), timed from the client's arrival of the second token to the last, as generate
   times its decode (median of --reps);
2. time to first token over HTTP for a --prompt-tokens prompt (token ids, each rep different after BOS, so the
   prompt cache holds only BOS): request sent to the first token's chunk, max_tokens 1 (median of --reps);
3. a --turns conversation through /v1/chat/completions, resent whole each turn as chat clients do: each turn's
   time to its first token and the prompt tokens it found cached (prefix reuse).

Prints a table and the server's aims, writes JSON to --out. Llama-2-7B random weights on one GPU:

    PYTHONPATH=. python scripts/make_random_checkpoint.py --shape llama-2-7b --tokenizer T /tmp/7b
    python scripts/serve_load.py --model /tmp/7b --out scripts/results/serve/h100.json

On the CPU with the bundled model (a smaller prompt and conversation fit its 512-token context):

    python scripts/serve_load.py --device cpu --prompt-tokens 256 --turns 4 --reply-tokens 16 --new-tokens 64
Arguments after -- go to both generate and serve (--fp8, --backend ...).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import httpx

PROMPT = "Once upon a time, there was a little girl named Lily. She loved to play outside in the park."
# The server's aims (docs/benchmarks.md): client decode at least 97% of generate's, first token of a 512-token
# prompt in at most 20 ms, later turns of a conversation in at most 15 ms.
TARGETS = {"decode_ratio": 0.97, "ttft_ms": 20.0, "later_turn_ttft_ms": 15.0}


def generate_decode(args, extra: list[str]) -> dict:
    cmd = [sys.executable, "-m", "llamafast", "generate", PROMPT, "--json", "--temperature", "0",
           "--max-new-tokens", str(args.new_tokens), *_model(args), *extra]
    runs = [json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
            for _ in range(args.generate_reps)]
    rates = [r["timings"]["decode_tokens_per_s"] for r in runs]
    return {"command": cmd[2:], "decode_tokens_per_s": statistics.median(rates), "runs": rates,
            "tokens": len(runs[0]["token_ids"])}


def start_server(args, extra: list[str]) -> tuple[subprocess.Popen, str]:
    cmd = [sys.executable, "-m", "llamafast", "serve", "--port", "0", "--max-queue", "1", *_model(args), *extra]
    if args.context:
        cmd += ["--context", str(args.context)]
    server = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
    line = server.stdout.readline()  # "llamafast serve: NAME ready at URL/v1 (...)"
    if " ready at " not in line:
        server.wait()
        sys.exit(f"serve did not start ({server.returncode})")
    return server, line.split(" ready at ")[1].split()[0].removesuffix("/v1")


@dataclass
class Streamed:
    sent: float  # perf_counter when the request went out
    arrivals: list[tuple[float, int]]  # (perf_counter, tokens) of each chunk that carried tokens
    text: str
    usage: dict


def stream(client: httpx.Client, path: str, body: dict) -> Streamed:
    body = {**body, "stream": True, "return_token_ids": True, "stream_options": {"include_usage": True}}
    out = Streamed(time.perf_counter(), [], "", {})
    with client.stream("POST", path, json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: {"):
                continue
            now, chunk = time.perf_counter(), json.loads(line[6:])
            out.usage = chunk.get("usage") or out.usage
            for choice in chunk["choices"]:
                out.text += choice.get("text") or choice.get("delta", {}).get("content") or ""
            n = sum(len(c.get("token_ids", [])) for c in chunk["choices"])
            if n:
                out.arrivals.append((now, n))
    return out


def client_decode(client: httpx.Client, args) -> dict:
    """Decode tokens/s as the client sees them, timed as generate times its decode: from the second token's
    arrival to the last, over the tokens after the second."""
    body = {"prompt": PROMPT, "max_tokens": args.new_tokens, "temperature": 0}
    stream(client, "/v1/completions", body)  # warm: whatever this sampling's first use costs
    rates = []
    for _ in range(args.reps):
        times = [t for t, n in stream(client, "/v1/completions", body).arrivals for _ in range(n)]
        rates.append((len(times) - 2) / (times[-1] - times[1]))
    return {"decode_tokens_per_s": statistics.median(rates), "runs": rates}


def first_token(client: httpx.Client, args) -> dict:
    """Prompts of exactly --prompt-tokens ids: BOS, then English text's ids, shuffled anew for each rep so that
    the prompt cache holds only BOS."""
    text = " ".join([PROMPT] * (args.prompt_tokens // 8 + 1))
    words = client.post("/tokenize", json={"content": text}).json()["tokens"]
    rng = random.Random(0)
    runs = []
    for _ in range(args.reps + 1):
        ids = [1] + rng.sample(words, len(words))[: args.prompt_tokens - 1]
        got = stream(client, "/v1/completions", {"prompt": ids, "max_tokens": 1, "temperature": 0})
        runs.append({"ttft_ms": (got.arrivals[0][0] - got.sent) * 1e3,
                     "cached_tokens": got.usage["prompt_tokens_details"]["cached_tokens"]})
    runs = runs[1:]  # the first is a warm-up
    return {"prompt_tokens": args.prompt_tokens, "ttft_ms": statistics.median(r["ttft_ms"] for r in runs),
            "runs": runs}


def conversation(client: httpx.Client, args) -> list[dict]:
    messages, turns = [], []
    for turn in range(1, args.turns + 1):
        messages.append({"role": "user", "content": f"Turn {turn}: tell me what happened next, in a few words."})
        got = stream(client, "/v1/chat/completions",
                     {"messages": messages, "max_tokens": args.reply_tokens, "temperature": 0})
        messages.append({"role": "assistant", "content": got.text})
        turns.append({"turn": turn, "ttft_ms": (got.arrivals[0][0] - got.sent) * 1e3,
                      "prompt_tokens": got.usage["prompt_tokens"],
                      "cached_tokens": got.usage["prompt_tokens_details"]["cached_tokens"]})
    return turns


def _model(args) -> list[str]:
    return [*(["--model", args.model] if args.model else []), *(["--device", args.device] if args.device else [])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="checkpoint (default: the bundled stories260K)")
    parser.add_argument("--device")
    parser.add_argument("--context", type=int, help="serve's --context (default: the model's)")
    parser.add_argument("--new-tokens", type=int, default=256, help="tokens decoded per decode measurement")
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--turns", type=int, default=20)
    parser.add_argument("--reply-tokens", type=int, default=32, help="max_tokens of each conversation turn")
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--generate-reps", type=int, default=3)
    parser.add_argument("--out")
    args, extra = parser.parse_known_args()
    extra = extra[1:] if extra[:1] == ["--"] else extra
    gen = generate_decode(args, extra)
    server, url = start_server(args, extra)
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            model = client.get("/v1/models").json()["data"][0]
            decode = client_decode(client, args)
            ttft = first_token(client, args)
            turns = conversation(client, args)
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=120)
    report = _report(args, extra, model, gen, decode, ttft, turns, code)
    _print(report)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


def _report(args, extra, model, gen, decode, ttft, turns, code) -> dict:
    import torch

    later = [t["ttft_ms"] for t in turns[1:]]
    ratio = decode["decode_tokens_per_s"] / gen["decode_tokens_per_s"]
    return {
        "model": model["id"], "context": model.get("context_length"), "extra_args": extra,
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() and args.device != "cpu" else "cpu",
        "torch": torch.__version__, "generate": gen, "serve_decode": decode, "decode_ratio": ratio,
        "ttft": ttft, "conversation": turns, "later_turns_max_ttft_ms": max(later) if later else None,
        "serve_exit_code": code,
        "targets": {"decode_ratio": ratio >= TARGETS["decode_ratio"], "ttft_ms": ttft["ttft_ms"] <= TARGETS["ttft_ms"],
                    "later_turn_ttft_ms": bool(later) and max(later) <= TARGETS["later_turn_ttft_ms"]},
    }


def _print(r: dict) -> None:
    g, d = r["generate"]["decode_tokens_per_s"], r["serve_decode"]["decode_tokens_per_s"]
    print(f"{r['model']} on {r['gpu']} (context {r['context']}; {' '.join(r['extra_args']) or 'defaults'})")
    print(f"{'decode tok/s, generate --json':44} {g:10.1f}")
    print(f"{'decode tok/s, streaming client':44} {d:10.1f}   {r['decode_ratio']:.1%} of generate "
          f"(target >= {TARGETS['decode_ratio']:.0%})")
    print(f"{'first token, ' + str(r['ttft']['prompt_tokens']) + '-token prompt over HTTP (ms)':44} "
          f"{r['ttft']['ttft_ms']:10.2f}   (target <= {TARGETS['ttft_ms']:g})")
    print(f"{'turn':>6} {'prompt':>8} {'cached':>8} {'first token (ms)':>18}")
    for t in r["conversation"]:
        print(f"{t['turn']:>6} {t['prompt_tokens']:>8} {t['cached_tokens']:>8} {t['ttft_ms']:>18.2f}")
    if r["later_turns_max_ttft_ms"] is not None:
        print(f"later turns: at most {r['later_turns_max_ttft_ms']:.2f} ms (target <= "
              f"{TARGETS['later_turn_ttft_ms']:g}); serve exited {r['serve_exit_code']}")


if __name__ == "__main__":
    main()
