"""The bad inputs of test_bad_input.py, as data: (command, what it tries, a setup that writes files under tmp
and returns the arguments, a needle its one-line error must contain), grouped for docs/cli.md's "What is
refused" table (scripts/refusals.py). Files come from tests/formats.py's writers or the bundled stories260K.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from llamafast.load import bundled_model

from ..conftest import LLAMA2C
from .bad_input_files import (
    CALIBRATION, RANK0_OF_2, bin_header, busy_port, chat, converted, copy_bundled, file, gguf, gguf_nan, hf,
    hf_json_tokenizer, hf_tokenizer_config, meta, pickle_pth, preset, sparsified, sparsify_args, truncate,
    untied_without_head,
)


@dataclass(frozen=True)
class Case:
    command: str
    what: str
    setup: Callable[[Path], list[str]]  # tmp dir -> the arguments after the command
    needle: str
    stdin: str | bytes | None = None
    needs: Path | None = None  # test data the case reads from ../shared
    env: dict[str, str | None] | None = None  # environment variables set (None: unset) while the command runs

    @property
    def id(self) -> str:
        return f"{self.command}: {self.what}"


M = lambda folder: ["hi", "--model", str(folder)]  # noqa: E731  a generate call on a checkpoint
BENCH = ["--random-weights", "--shape", "stories260K", "--device", "cpu"]
GENERATE = "generate"
SERVE = "serve"
S = ["--device", "cpu", "--port", "0"]  # serve's cases: each is refused before it listens, or fails to load

CASES_BY_GROUP: dict[str, list[Case]] = {
    "Checkpoint files": [
        Case(GENERATE, "a model path that does not exist", lambda t: M(t / "nope"), "model path not found"),
        Case(GENERATE, "an empty file", lambda t: M(file(t, "m.bin", b"")), "unknown checkpoint format"),
        Case(GENERATE, "a file of text", lambda t: M(file(t, "m.bin", b"hello, not a model")),
             "unknown checkpoint format"),
        Case(GENERATE, "a directory with no checkpoint", lambda t: M(t), "cannot tell the checkpoint format"),
        Case(GENERATE, "a truncated llama2.c .bin (version 0)",
             lambda t: M(file(t, "m.bin", bundled_model().read_bytes()[:500000])), "truncated"),
        Case(GENERATE, "a llama2.c header with a huge dim",
             lambda t: M(bin_header(t, (1 << 30, 172, 5, 8, 4, 512, 512))), "truncated, or not a llama2.c file"),
        Case(GENERATE, "a llama2.c version 1 header with zero heads",
             lambda t: M(bin_header(t, (64, 172, 5, 0, 4, 512, 512), magic=True)),
             "n_heads must be a positive integer"),
        Case(GENERATE, "a truncated safetensors file",
             lambda t: M(truncate(hf(t) / "model.safetensors", 3000).parent), "truncated"),
        Case(GENERATE, "a truncated consolidated.00.pth",
             lambda t: M(truncate(meta(t) / "consolidated.00.pth", 3000).parent), "cannot read"),
        Case(GENERATE, "a .pth that pickles an arbitrary object", pickle_pth, "never runs code"),
        Case(GENERATE, "a corrupt tokenizer.model", lambda t: M(file(hf(t), "tokenizer.model", b"garbage").parent),
             "tokenizer"),
    ],
    "Configs": [
        Case(GENERATE, "params.json with one layer too many", lambda t: M(meta(t, n_layers=3)), "layers.2"),
        Case("info", "params.json with the wrong KV heads", lambda t: ["--model", str(meta(t, n_kv_heads=4))],
             "shape"),
        Case(GENERATE, "params.json whose top level is a list",
             lambda t: M(file(meta(t), "params.json", b"[1, 2]").parent), "expected a JSON object"),
        Case(GENERATE, "config.json whose top level is a list", lambda t: M(file(hf(t), "config.json", b"[]").parent),
             "expected a JSON object"),
        Case(GENERATE, "config.json with num_attention_heads 0", lambda t: M(hf(t, num_attention_heads=0)),
             "num_attention_heads must be a positive integer"),
        Case("info", "config.json with num_attention_heads 0",
             lambda t: ["--model", str(hf(t, num_attention_heads=0))], "num_attention_heads"),
        Case(GENERATE, "config.json with a string hidden_size", lambda t: M(hf(t, hidden_size="32")),
             "hidden_size must be a positive integer"),
    ],
    "Arithmetic llamafast does not implement": [
        Case(GENERATE, "transformers 5 rope_parameters with rope_type yarn",
             lambda t: M(hf(t, rope_parameters={"rope_type": "yarn", "rope_theta": 500000.0, "factor": 8.0})),
             "rope_parameters.rope_type"),
        Case(GENERATE, "a top-level rope_scaling", lambda t: M(hf(t, rope_scaling={"type": "linear", "factor": 2.0})),
             "rope_scaling"),
        Case(GENERATE, "attention_bias true", lambda t: M(hf(t, attention_bias=True)), "attention_bias"),
        Case(GENERATE, "mlp_bias true", lambda t: M(hf(t, mlp_bias=True)), "mlp_bias"),
        Case(GENERATE, "a head_dim other than hidden_size / heads", lambda t: M(hf(t, head_dim=16)), "head_dim"),
        Case(GENERATE, "a sliding_window", lambda t: M(hf(t, sliding_window=32)), "sliding_window"),
        Case(GENERATE, "an activation other than SiLU", lambda t: M(hf(t, hidden_act="gelu")), "hidden_act"),
        Case(GENERATE, "partial rotary embeddings",
             lambda t: M(hf(t, rope_parameters={"rope_type": "default", "partial_rotary_factor": 0.5})),
             "partial_rotary_factor"),
        Case(GENERATE, "a model type other than llama", lambda t: M(hf(t, model_type="mistral")), "not Llama"),
        Case(GENERATE, "Llama 3.1's use_scaled_rope in params.json", lambda t: M(meta(t, use_scaled_rope=True)),
             "use_scaled_rope"),
        Case(GENERATE, "an untied config without lm_head.weight", lambda t: M(untied_without_head(t)),
             "lm_head.weight"),
    ],
    "Prompts": [
        Case(GENERATE, "a prompt file that is not UTF-8",
             lambda t: ["--prompt-file", str(file(t, "p.txt", b"caf\xe9"))], "byte 3"),
        Case(GENERATE, "standard input that is not UTF-8", lambda t: ["-"], "standard input is not UTF-8", b"caf\xe9"),
        Case(GENERATE, "a prompt file that does not exist", lambda t: ["--prompt-file", str(t / "nope.txt")],
             "cannot read --prompt-file"),
        Case(GENERATE, "both PROMPT and --prompt-file", lambda t: ["hi", "--prompt-file", str(file(t, "p", b"x"))],
             "not both"),
        Case(GENERATE, "no prompt at all", lambda t: [], "no prompt"),
        Case(GENERATE, "a prompt longer than the context", lambda t: ["Once upon a time " * 200], "context is 512"),
        Case(GENERATE, "prompt plus --max-new-tokens beyond the context",
             lambda t: ["Once upon a time " * 100, "--max-new-tokens", "256"], "--max-new-tokens"),
        Case(GENERATE, "--system without --chat", lambda t: ["hi", "--system", "Be brief."], "--system"),
        # Python hands over argument bytes that are not UTF-8 (`generate $'caf\xe9'`) as lone surrogates.
        Case(GENERATE, "a PROMPT argument that is not UTF-8", lambda t: ["caf\udce9"], "PROMPT is not UTF-8"),
        Case(GENERATE, "a --system argument that is not UTF-8", lambda t: ["hi", "--chat", "--system", "\udcff"],
             "the byte 0xff"),
    ],
    "Options": [
        *[Case(GENERATE, f"{flag} {value}", lambda t, f=flag, v=value: ["hi", f, v], flag) for flag, value in [
            ("--top-p", "0"), ("--top-p", "1.5"), ("--temperature", "-1"), ("--temperature", "inf"), ("--top-k", "-1"),
            ("--repetition-penalty", "0"), ("--repetition-penalty", "inf"), ("--repetition-penalty", "1e-300"),
            ("--repetition-penalty", "1000"), ("--max-new-tokens", "0"),
            ("--seed", str(2**64)), ("--seed", str(-(2**63) - 1)),
        ]],
        Case(GENERATE, "--dtype with an unknown value", lambda t: ["hi", "--dtype", "unknown"], "--dtype"),
        Case(GENERATE, "an option without its value", lambda t: ["hi", "--max-new-tokens"], "--max-new-tokens"),
        Case(GENERATE, "an unknown option", lambda t: ["hi", "--no-such-option"], "--no-such-option"),
        *[Case(GENERATE, f"--device {d}", lambda t, d=d: ["hi", "--device", d], needle) for d, needle in [
            ("meta", "not on meta"), ("mps", "not on mps"), ("cuda:9", "cuda:9"), ("potato", "unknown device"),
        ]],
    ],
    "Run presets": [
        Case(GENERATE, "--config naming a directory", lambda t: ["hi", "--config", str(t)], "is a directory"),
        Case(GENERATE, "--config naming no file", lambda t: ["hi", "--config", str(t / "nope.toml")], "not found"),
        Case(GENERATE, "--config naming a missing file named like a bundled preset",
             lambda t: ["hi", "--config", str(t / "no" / "greedy.toml")], "not found"),
        Case(GENERATE, "--config naming no bundled preset", lambda t: ["hi", "--config", "greedier"], "greedy"),
        Case(GENERATE, "a preset that is not TOML", lambda t: ["hi", "--config", str(preset(t, "x = = 1"))],
             "not valid TOML"),
        Case(GENERATE, "a preset that is not UTF-8", lambda t: ["hi", "--config", str(preset(t, b"x = '\xe9'"))],
             "not UTF-8"),
        Case(GENERATE, "a preset with an unknown key", lambda t: ["hi", "--config", str(preset(t, "temprature = 1"))],
             "unknown keys"),
        Case(GENERATE, "a preset with an unknown dtype", lambda t: ["hi", "--config", str(preset(t, 'dtype = "fp7"'))],
             "dtype"),
        Case(GENERATE, "a preset with an unknown backend",
             lambda t: ["hi", "--config", str(preset(t, 'backend = "cuda"'))], "backend"),
        Case(GENERATE, "a preset with an integer given as a string",
             lambda t: ["hi", "--config", str(preset(t, 'max_new_tokens = "5"'))],
             "max_new_tokens must be an integer"),
        Case(GENERATE, "a preset with temperature as a string",
             lambda t: ["hi", "--config", str(preset(t, '[sampling]\ntemperature = "hot"'))], "sampling.temperature"),
        Case(GENERATE, "a preset with sampling as a number",
             lambda t: ["hi", "--config", str(preset(t, "sampling = 3"))], "[sampling] table"),
        Case(GENERATE, "a bench preset (shape, random weights)", lambda t: ["hi", "--config", "bench-7b"], "shape"),
        Case("bench", "a preset with a [sampling] table",
             lambda t: [*BENCH, "--config", str(preset(t, "[sampling]\ntemperature = 0.0"))], "sampling"),
    ],
    "Tokenizer": [
        Case(GENERATE, "a tokenizer with more pieces than the model has ids",
             lambda t: ["hi", "--tokenizer", str(LLAMA2C / "tokenizer.model")], "32000 pieces", needs=LLAMA2C),
    ],
    "convert-fp8": [
        Case("convert-fp8", "DST equal to SRC, with --force", lambda t: [str(hf(t)), str(t / "hf"), "--force"],
             "overlaps"),
        Case("convert-fp8", "DST inside SRC", lambda t: [str(hf(t)), str(t / "hf" / "fp8")], "overlaps"),
        Case("convert-fp8", "DST containing SRC, with --force", lambda t: [str(hf(t)), str(t), "--force"], "overlaps"),
        Case("convert-fp8", "a llama2.c .bin onto itself, with --force",
             lambda t: [str(copy_bundled(t)), str(t / "stories.bin"), "--force"], "overlaps"),
        Case("convert-fp8", "DST an existing regular file, with --force",
             lambda t: [str(bundled_model()), str(file(t, "out", b"keep me")), "--force"], "not a directory"),
        Case("convert-fp8", "DST a directory of other files, with --force",
             lambda t: [str(bundled_model()), str(hf(t)), "--force"], "not a llamafast checkpoint"),
        Case("convert-fp8", "DST that exists, without --force", lambda t: [str(bundled_model()), str(t)], "--force"),
        Case("convert-fp8", "DST the current directory, with --force", lambda t: [str(bundled_model()), ".", "--force"],
             "current directory"),
        Case("convert-fp8", "DST under a regular file",
             lambda t: [str(bundled_model()), str(file(t, "f", b"") / "sub" / "out")], "cannot write"),
        Case("convert-fp8", "a source that already holds FP8 weights", lambda t: [str(converted(t)), str(t / "again")],
             "already holds fp8_e5m2"),
        Case("convert-fp8", "a source that does not exist", lambda t: [str(t / "nope"), str(t / "out")], "not found"),
    ],
    "GGUF files and tokenizers": [
        Case(GENERATE, "a GGUF of another architecture", lambda t: M(gguf(t, arch="gpt2")), "architecture 'gpt2'"),
        Case(GENERATE, "a GGUF tensor type llamafast does not dequantize", lambda t: M(gguf(t, kind="Q5_0")),
             "has type Q5_0"),
        Case(GENERATE, "a truncated GGUF", lambda t: M(truncate(gguf(t), 20000)), "not a readable GGUF"),
        Case(GENERATE, "a tokenizer.json that does not parse", lambda t: M(hf_json_tokenizer(t, b"{not json")),
             "tokenizer.json"),
        Case(GENERATE, "a chat template that fails to render",
             lambda t: ["hi", "--chat", "--model", str(gguf(t, chat_template="{{ raise_exception('no chat') }}"))],
             "chat template failed to render"),
        Case(GENERATE, "a chat template that divides by zero", chat("{{ 1 // 0 }}"), "ZeroDivisionError"),
        Case(GENERATE, "a chat template that adds a number to a string", chat('{{ "a" + 5 }}'), "TypeError"),
        Case(GENERATE, "a chat template looping 100 million times", chat("{% for i in range(100000000) %}{% endfor %}"),
             "range"),
        Case(GENERATE, "a GGUF chat_template that is a number", chat(5), "tokenizer.chat_template must be"),
        Case(GENERATE, "a tokenizer_config.json chat_template that is a number",
             lambda t: M(hf_tokenizer_config(t, {"eos_token": "<|endoftext|>", "chat_template": 5})),
             "chat_template must be"),
        Case(GENERATE, "a chat_template list without a default",
             lambda t: M(hf_tokenizer_config(t, {"eos_token": "<|endoftext|>",
                                                  "chat_template": [{"name": "tool_use", "template": "x"}]})),
             'no template named "default"'),
        Case(GENERATE, "a GGUF without tokenizer.ggml.eos_token_id", lambda t: M(gguf(t, eos=None)), "eos_token_id"),
        Case(GENERATE, "a GGUF whose bos_token_id is outside its vocabulary", lambda t: M(gguf(t, bos=512)),
             "outside its vocabulary of 512"),
        Case(GENERATE, "a GGUF with a NaN weight", lambda t: [*M(gguf_nan(t)), "--max-new-tokens", "4"],
             "layers.1.feed_forward.w2.weight holds NaN"),
        Case("chat", "a GGUF with a NaN weight", lambda t: ["--model", str(gguf_nan(t)), "--max-new-tokens", "4"],
             "layers.1.feed_forward.w2.weight holds NaN", stdin="hi\n"),
        Case(GENERATE, "a tokenizer.json without tokenizer_config.json", lambda t: M(hf_tokenizer_config(t, None)),
             "no tokenizer_config.json"),
        Case(GENERATE, "a tokenizer_config.json without eos_token", lambda t: M(hf_tokenizer_config(t, {})),
             "names no eos_token"),
        Case(GENERATE, "a tokenizer_config.json whose eos_token is not in the vocabulary",
             lambda t: M(hf_tokenizer_config(t, {"eos_token": "</s>"})), "'</s>' is not in the vocabulary"),
    ],
    "eval": [
        Case("eval", "an unknown --variant", lambda t: ["--variant", "fp9"], "choose from"),
        Case("eval", "--tokens beyond the context", lambda t: ["--tokens", "600"], "context is 512"),
        Case("eval", "a --text file of one token", lambda t: ["--text", str(file(t, "one.txt", b""))], "nothing to score"),
        Case("eval", "a --text file that does not exist", lambda t: ["--text", str(t / "nope.txt")], "cannot read --text"),
        Case("eval", "a --text file that is not UTF-8", lambda t: ["--text", str(file(t, "t.txt", b"caf\xe9"))],
             "--text"),
        Case("eval", f"--seed {2**64}", lambda t: ["--seed", str(2**64)], "--seed"),
        Case("eval", "a --seed whose last prompt's seed is past the range",
             lambda t: ["--seed", str(2**64 - 1), "--prompts", "2"], "--seed"),
    ],
    "sparsify and --sparsity": [
        Case("sparsify", "a calibration text too short",
             lambda t: sparsify_args(t, "--group-size", "4", text=file(t, "short.txt", b"Once upon a time")),
             "needs at least 512"),
        Case("sparsify", "a group size that does not divide the FFN width",
             lambda t: sparsify_args(t, "--group-size", "32"), "does not divide"),
        Case("sparsify", "a group size that is not a power of two", lambda t: sparsify_args(t, "--group-size", "3"),
             "power of two"),
        Case("sparsify", "--sparsity beyond 0.95", lambda t: sparsify_args(t, "--sparsity", "0.99"), "[0, 0.95]"),
        *[Case("sparsify", f"--group-size {g}", lambda t, g=g: sparsify_args(t, "--group-size", g),
               "positive power of two") for g in ("0", "-4")],
        Case("sparsify", f"--seed {2**64}", lambda t: sparsify_args(t, "--seed", str(2**64)), "--seed"),
        Case("sparsify", "a checkpoint that is already sparsified",
             lambda t: [str(sparsified(t)), str(t / "again"), "--text", str(CALIBRATION)], "already sparsified"),
        Case(GENERATE, "--sparsity on a checkpoint without routers", lambda t: ["hi", "--sparsity", "0.5"],
             "has no routers"),
        Case(GENERATE, "--sparsity below 0", lambda t: [*M(sparsified(t)), "--sparsity", "-0.1"], "[0, 0.95]"),
        Case("bench", "--sparsity on a checkpoint without routers", lambda t: ["--device", "cpu", "--sparsity", "0.5"],
             "has no routers"),
        Case("bench", "--sparsity values that are not numbers", lambda t: [*BENCH, "--sparsity", "half"],
             "comma-separated numbers"),
        Case("bench", "--sparse-mode without --sparsity", lambda t: [*BENCH, "--sparse-mode", "gate"], "only with --sparsity"),
        Case("eval", "--sparsity on a checkpoint without routers", lambda t: ["--sparsity", "0.5"], "has no routers"),
        Case("eval", "--sparse-mode without --sparsity", lambda t: ["--sparse-mode", "gate"], "only with --sparsity"),
    ],
    "bench and info": [
        Case("bench", "--random-weights without --shape", lambda t: ["--random-weights"], "--shape"),
        Case("bench", "an unknown shape", lambda t: ["--random-weights", "--shape", "llama-3"], "unknown shape"),
        Case("bench", "--shape without --random-weights", lambda t: ["--shape", "stories260K"], "--random-weights"),
        Case("bench", "--prefill lengths that are not numbers", lambda t: [*BENCH, "--prefill", "--prompt-lens", "a,5"],
             "comma-separated"),
        Case("bench", "a --prefill length beyond the context", lambda t: [*BENCH, "--prefill", "--prompt-lens", "600"],
             "context is 512"),
        Case("bench", "--prompt-len 0", lambda t: [*BENCH, "--prompt-len", "0"], "--prompt-len"),
        Case("bench", "--kernels on the CPU", lambda t: ["--kernels", "--device", "cpu"], "CUDA GPU"),
        Case("bench", "--timeline on the CPU", lambda t: [*BENCH, "--timeline"], "CUDA GPU"),
        Case("info", "a model path that does not exist", lambda t: ["--model", str(t / "nope")], "not found"),
        Case("info", "an unknown --shape", lambda t: ["--shape", "llama-9"], "unknown shape"),
    ],
    "Output and files": [
        Case("eval", "--out naming a directory", lambda t: ["--out", str(t)], "is a directory"),
        Case("eval", "--out where no file can be created", lambda t: ["--out", "/proc/x.json"], "cannot write --out"),
        Case("chat", "/save onto a file that exists", lambda t: ["--device", "cpu", "--max-new-tokens", "4"],
             "README.md exists; /save! README.md replaces it", stdin="/save README.md\n"),
        Case("bench", "--out in a directory that does not exist", lambda t: [*BENCH, "--out", str(t / "no" / "x.json")],
             "cannot write --out"),
    ],
    "serve": [
        Case(SERVE, "--port 70000", lambda t: ["--port", "70000"], "--port 70000 is not a port"),
        Case(SERVE, "--port -1", lambda t: ["--port", "-1"], "is not a port"),
        Case(SERVE, "a port another program listens on", busy_port, "Address already in use"),
        Case(SERVE, "--host an address this machine does not have", lambda t: [*S, "--host", "192.0.2.1"],
             "cannot listen on 192.0.2.1"),
        Case(SERVE, "a model path that does not exist", lambda t: [*S, "--model", str(t / "nope")],
             "model path not found"),
        Case(SERVE, "--context 1", lambda t: [*S, "--context", "1"], "--context must be between 2"),
        Case(SERVE, "--context beyond the model's", lambda t: [*S, "--context", "513"], "context of 512"),
        Case(SERVE, "--max-new-tokens 0", lambda t: [*S, "--max-new-tokens", "0"], "--max-new-tokens"),
        Case(SERVE, "--max-queue -1", lambda t: [*S, "--max-queue", "-1"], "--max-queue must be 0 or more"),
        Case(SERVE, "an empty --api-key", lambda t: [*S, "--api-key", " "], "--api-key is empty"),
        Case(SERVE, "--temperature -1", lambda t: [*S, "--temperature", "-1"], "--temperature"),
        Case(SERVE, "--backend compile on the CPU", lambda t: [*S, "--backend", "compile"], "needs a CUDA GPU"),
        Case(SERVE, "--sparsity on a checkpoint without routers", lambda t: [*S, "--sparsity", "0.5"],
             "has no routers"),
        Case(SERVE, "a bench preset (shape, random weights)", lambda t: [*S, "--config", "bench-7b"], "shape"),
        Case(SERVE, "--tp 2", lambda t: [*S, "--tp", "2"], "serve runs on one GPU"),
        Case(SERVE, "under torchrun", lambda t: S, "serve does not run under torchrun", env=RANK0_OF_2),
        Case(SERVE, "a GGUF with a NaN weight (found as it loads, after it listens)",
             lambda t: [*S, "--model", str(gguf_nan(t))], "layers.1.feed_forward.w2.weight holds NaN"),
    ],
    "Settings (LLAMAFAST_* variables)": [
        *[Case(GENERATE, f"{name}={value}", lambda t: ["hi"], f"{name}='{value}': expected {what}", env={name: value})
          for name, value, what in [
              ("LLAMAFAST_TUNE", "maybe", "1 or 0"), ("LLAMAFAST_PRELOAD", "2", "1 or 0"),
              ("LLAMAFAST_LOAD_THREADS", "0", "a whole number from 1 to 64"),
              ("LLAMAFAST_LOAD_THREADS", "four", "a whole number from 1 to 64"),
              ("LLAMAFAST_TP_TIMEOUT", "soon", "a positive number of seconds"),
          ]],
        Case("info", "LLAMAFAST_TUNE=maybe", lambda t: [], "LLAMAFAST_TUNE", env={"LLAMAFAST_TUNE": "maybe"}),
    ],
    "Tensor parallel (torchrun)": [
        Case(GENERATE, "--tp 2 without torchrun", lambda t: ["hi", "--tp", "2"], "torchrun --standalone --nproc-per-node 2"),
        Case(GENERATE, "--tp 0", lambda t: ["hi", "--tp", "0"], "at least 1"),
        Case("bench", "--tp-comm without tensor parallelism", lambda t: [*BENCH, "--tp-comm", "nccl"],
             "only to a tensor-parallel run"),
        Case(GENERATE, "WORLD_SIZE without RANK, MASTER_ADDR and MASTER_PORT (not torchrun)", lambda t: ["hi"],
             "torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT",
             env={"WORLD_SIZE": "2", "RANK": None, "MASTER_ADDR": None, "MASTER_PORT": None}),
        *[Case(GENERATE, f"LLAMAFAST_TP_TIMEOUT={value} under torchrun", lambda t: ["hi"],
               f"LLAMAFAST_TP_TIMEOUT='{value}': expected a positive number of seconds",
               env={**RANK0_OF_2, "LLAMAFAST_TP_TIMEOUT": value}) for value in ("soon", "0", "-5", "nan")],
        Case("convert-fp8", "under torchrun", lambda t: [str(bundled_model()), str(t / "out")],
             "convert-fp8 does not run under torchrun", env=RANK0_OF_2),
        Case("chat", "under torchrun", lambda t: [], "chat does not run under torchrun", stdin="hi\n", env=RANK0_OF_2),
        Case("info", "under torchrun", lambda t: [], "info does not run under torchrun", env=RANK0_OF_2),
    ],
}
CASES = [case for cases in CASES_BY_GROUP.values() for case in cases]


