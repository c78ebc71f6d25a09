"""The command line through Typer's CliRunner: golden text, options, and bad input (one line, exit code 1)."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
import sys

import pytest
import torch
import typer
from typer.testing import CliRunner

from llamafast.cli import app
from llamafast.cli.bench import route
from llamafast.config import MODEL_CONFIGS, FP8Format, ModelConfig
from llamafast.load import bundled_model

from ..formats import meta_state, write_hf

runner = CliRunner()
BENCH = typer.main.get_command(app).commands["bench"]


def _run(*args: str, input: str | None = None):
    return runner.invoke(app, list(args), input=input)


def test_bundled_golden_exact(golden):
    r = _run("generate", "Once upon a time", "--temperature", "0", "--max-new-tokens", "64")
    assert r.exit_code == 0, r.stderr
    assert r.stdout == golden["prompt_once_upon_a_time"]["continuation_text"] + "\n"
    # The CPU fallback is announced once, and only without a GPU (on one the triton backend ran the text above).
    assert r.stderr.count("running the reference path on the CPU") == (0 if torch.cuda.is_available() else 1)


def test_bos_only_from_empty_prompt(golden):
    r = _run("generate", "", "--temperature", "0", "--max-new-tokens", "200")
    assert r.stdout == golden["bos_only"]["steps_200_text"] + "\n"


def test_json_output(golden):
    r = _run("generate", "Once upon a time", "--temperature", "0", "--max-new-tokens", "64", "--json")
    assert r.exit_code == 0, r.stderr
    out = json.loads(r.stdout)
    case = golden["prompt_once_upon_a_time"]
    assert out["token_ids"] == case["continuation_ids"] and out["text"] == case["continuation_text"]
    assert out["prompt_ids"] == case["prompt_ids_with_bos"] and out["finish_reason"] == "length"
    assert out["timings"]["ttft_s"] > 0 and out["timings"]["decode_tokens"] == 62  # 1st: ttft; 2nd: first_step_s


def test_prompt_from_stdin_and_file(tmp_path):
    args = ("--temperature", "0", "--max-new-tokens", "16")
    direct = _run("generate", "Once upon a time", *args).stdout
    assert _run("generate", "-", *args, input="Once upon a time").stdout == direct
    (tmp_path / "p.txt").write_text("Once upon a time")
    assert _run("generate", "--prompt-file", str(tmp_path / "p.txt"), *args).stdout == direct


def test_echo_prints_prompt_first():
    r = _run("generate", "Once upon a time", "--temperature", "0", "--max-new-tokens", "4", "--echo")
    assert r.stdout.startswith("Once upon a time, there was")


def test_stop_string_cuts_exactly():
    r = _run("generate", "Once upon a time", "--temperature", "0", "--max-new-tokens", "64", "--stop", "Lily", "--json")
    out = json.loads(r.stdout)
    assert out["text"] == ", there was a little girl named " and out["finish_reason"] == "stop"


def test_seed_reproducible_through_cli():
    args = ("generate", "Once upon a time", "--temperature", "1", "--max-new-tokens", "32", "--json")
    a, b = (json.loads(_run(*args, "--seed", "3").stdout) for _ in range(2))
    assert a["token_ids"] == b["token_ids"] and a["seed"] == 3


def test_chat_prompt_is_wrapped():
    r = _run("generate", "Hi", "--chat", "--system", "Be kind.", "--max-new-tokens", "2", "--json")
    out = json.loads(r.stdout)
    # tok512 has no [INST] pieces; the wrapped prompt is longer than the plain one either way.
    plain = json.loads(_run("generate", "Hi", "--max-new-tokens", "2", "--json").stdout)
    assert len(out["prompt_ids"]) > len(plain["prompt_ids"]) + 10


def test_info_bundled():
    r = _run("info", "--json")
    data = json.loads(r.stdout)
    assert data["format"] == "llama2c" and data["parameters"] == 260_032 and data["tied_embeddings"]


def test_bench_on_cpu_tiny():
    r = _run("bench", "decode", "--random-weights", "--shape", "stories260K", "--new-tokens", "8", "--prompt-len", "4",
             "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    (row,) = report["results"]
    assert row["backend"] == "reference" and row["decode_tokens"] == 7 and row["decode_tokens_per_s"] > 0
    assert report["copy_bw_gb_s"] > 0 and 0 < row["fraction_of_copy_bw"] and report["kernels_preloaded"] == 0


@pytest.mark.parametrize("old,new", [
    ("", "decode"),
    ("--model M --json", "decode --model M --json"),
    ("--prefill --prompt-lens 5", "prefill --prompt-lens 5"),
    ("--kernels --shape llama-2-7b", "kernels --shape llama-2-7b"),
    ("--kernels --prefill", "kernels --prefill"),
    ("--fp8 --timeline", "timeline --fp8"),
    ("--sparsity=0.5 --sparse-mode gate", "sparse --sparsity=0.5 --sparse-mode gate"),
    ("--sparse-mode gate", "sparse --sparse-mode gate"),
    ("prefill --reps 2", "prefill --reps 2"),
    ("--help", "--help"),
])
def test_the_single_bench_commands_spellings_pick_a_subcommand(old, new):
    assert route(old.split(), BENCH.commands) == new.split()


@pytest.mark.parametrize("args", [  # the spellings of scripts/*.sh and docs/*.md
    "--config bench-7b --backend triton --out x.json",
    "--random-weights --shape llama-2-7b --fp8 --fp8-format e4m3 --new-tokens 128 --backend compile",
    "--kernels --shape llama-2-7b --fp8 --context 4096 --json --out x.json",
    "--kernels --prefill --shape llama-2-7b --out x.json",
    "--random-weights --shape llama-2-7b --prefill --chunk 512 --prompt-lens 512,4000 --reps 7 --backend triton --tp 2",
    "--random-weights --shape llama-2-7b --timeline --fp8 --reps 20",
    "--random-weights --shape llama-2-7b --sparsity 0,0.3 --sparse-mode router --sparse-mode gate --fp8 --new-tokens 9",
    "--model M --json",
    "--random-weights --shape llama-2-70b --new-tokens 128 --tp-comm symm --tp-comm nccl",
])
def test_the_single_bench_commands_spellings_parse(args):
    """Each routed spelling is one its subcommand takes (parsed, not run)."""
    name, *rest = route(args.split(), BENCH.commands)
    BENCH.commands[name].make_context(name, rest)


def test_preset_file(tmp_path):
    (tmp_path / "p.toml").write_text('max_new_tokens = 5\n[sampling]\ntemperature = 0.0\n')
    out = json.loads(_run("generate", "Once upon a time", "--config", str(tmp_path / "p.toml"), "--json").stdout)
    assert len(out["token_ids"]) == 5 and out["text"] == ", there was a little"


def test_stdin_and_file_lose_one_trailing_newline(tmp_path):
    """`echo "..." | llamafast generate -` gives the same ids as the bare argument (echo adds a newline)."""
    args = ("--temperature", "0", "--max-new-tokens", "4", "--json")
    direct = json.loads(_run("generate", "Once upon a time", *args).stdout)["prompt_ids"]
    assert json.loads(_run("generate", "-", *args, input="Once upon a time\n").stdout)["prompt_ids"] == direct
    (tmp_path / "p.txt").write_text("Once upon a time\n")
    assert json.loads(_run("generate", "--prompt-file", str(tmp_path / "p.txt"), *args).stdout)["prompt_ids"] == direct


def test_empty_prompt_is_said_out_loud():
    r = _run("generate", "-", "--max-new-tokens", "2", input="")
    assert r.exit_code == 0 and "empty prompt" in r.stderr


@pytest.mark.slow
def test_output_into_a_closed_pipe_exits_quietly():
    """`llamafast generate ... | head -c 20`: the reader leaves early; no traceback, exit code 0."""
    cmd = f"{sys.executable} -m llamafast generate 'Once upon a time' --max-new-tokens 200 --device cpu | head -c 20"
    r = subprocess.run(["bash", "-o", "pipefail", "-c", cmd], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and len(r.stdout) == 20 and "Traceback" not in r.stderr, r.stderr


def test_help_shows_defaults():
    r = _run("generate", "--help")
    assert "[default: 0.6]" in r.stdout and "[default: 256]" in r.stdout and "greedy ." not in r.stdout


def test_usage_errors_are_one_line_exit_1():
    r = _run("generate", "hi", "--dtype", "unknown")
    assert r.exit_code == 1 and r.stderr.strip().startswith("error:") and len(r.stderr.strip().splitlines()) == 1


def test_bundled_presets_by_name():
    out = json.loads(_run("generate", "Once upon a time", "--config", "greedy", "--max-new-tokens", "8", "--json").stdout)
    assert out["text"] == ", there was a little girl named Lily"[: len(out["text"])] and len(out["token_ids"]) == 8


@pytest.mark.slow
def test_a_bare_name_is_the_bundled_preset_whatever_the_directory_holds(tmp_path, monkeypatch):
    """`--config greedy` beside a ./greedy file is still the bundled preset; ./greedy is the file."""
    (tmp_path / "greedy").write_text("max_new_tokens = 3\n")
    monkeypatch.chdir(tmp_path)
    args = ("generate", "Once upon a time", "--json")
    bundled = json.loads(_run(*args, "--config", "greedy").stdout)  # 256 new tokens at temperature 0
    assert bundled["text"].startswith(", there was a little girl named Lily") and len(bundled["token_ids"]) > 3
    assert len(json.loads(_run(*args, "--config", "./greedy").stdout)["token_ids"]) == 3


def test_transformers_5_rope_parameters_are_read(tmp_path, tiny_config):
    """transformers 5 writes rope_parameters {rope_theta, rope_type} instead of a top-level rope_theta."""
    write_hf(tmp_path, tiny_config, meta_state(tiny_config), tokenizer=bundled_model().with_name("tok512.model"))
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["rope_theta"]
    cfg["rope_parameters"] = {"rope_theta": 500000.0, "rope_type": "default"}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    info = json.loads(_run("info", "--model", str(tmp_path), "--json").stdout)
    assert info["config"]["rope_theta"] == 500000.0


def test_padded_vocabulary_never_samples_past_the_tokenizer(tmp_path):
    """A model with 600 ids and the 512-piece tokenizer: sampled text, never an id the tokenizer lacks."""
    config = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=600, multiple_of=8)
    state = meta_state(config)
    state["output.weight"][512:] += 5.0  # the padding rows would win every draw
    write_hf(tmp_path, config, state, tokenizer=bundled_model().with_name("tok512.model"))
    info = json.loads(_run("info", "--model", str(tmp_path), "--json").stdout)
    assert "never sampled" in info["note"]
    r = _run("generate", "hi", "--model", str(tmp_path), "--temperature", "1", "--seed", "1", "--max-new-tokens", "64",
             "--json")
    assert r.exit_code == 0, r.stderr
    assert max(json.loads(r.stdout)["token_ids"]) < 512


# --- bad input: one line on stderr, exit code 1 ----------------------------------------------------------


def _assert_clean_error(r, *needles: str):
    assert r.exit_code == 1, (r.exit_code, r.stdout, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]


def test_missing_model_path(tmp_path):
    _assert_clean_error(_run("generate", "hi", "--model", str(tmp_path / "nope")), "model path not found", "nope")


def test_truncated_safetensors(tmp_path, stories_copies):
    shutil.copytree(stories_copies / "hf", tmp_path / "hf")
    f = tmp_path / "hf" / "model.safetensors"
    f.write_bytes(f.read_bytes()[:500_000])
    _assert_clean_error(_run("generate", "hi", "--model", str(tmp_path / "hf")), "truncated", "model.safetensors")


def test_params_json_does_not_match_tensors(tmp_path, stories_copies):
    shutil.copytree(stories_copies / "meta", tmp_path / "meta")
    params = json.loads((tmp_path / "meta" / "params.json").read_text())
    params["n_layers"] = 6
    (tmp_path / "meta" / "params.json").write_text(json.dumps(params))
    _assert_clean_error(_run("generate", "hi", "--model", str(tmp_path / "meta")), "layers.5", "params.json")


def test_params_json_wrong_width(tmp_path, stories_copies):
    shutil.copytree(stories_copies / "meta", tmp_path / "meta")
    params = json.loads((tmp_path / "meta" / "params.json").read_text())
    params["n_kv_heads"] = 8  # the tensors have 4 KV heads
    (tmp_path / "meta" / "params.json").write_text(json.dumps(params))
    _assert_clean_error(_run("info", "--model", str(tmp_path / "meta")), "layers.0.attention.wk.weight", "shape")


@pytest.mark.parametrize("content", [b"", b"hello, not a model", b"\x00" * 4096])
def test_unknown_format(tmp_path, content):
    (tmp_path / "weights.dat").write_bytes(content)
    _assert_clean_error(_run("generate", "hi", "--model", str(tmp_path / "weights.dat")), "unknown checkpoint format")
    _assert_clean_error(_run("generate", "hi", "--model", str(tmp_path)), "cannot tell the checkpoint format")


def test_prompt_longer_than_context():
    _assert_clean_error(_run("generate", "Once upon a time " * 200), "the model's context is 512 tokens")


def test_prompt_plus_new_tokens_beyond_context():
    _assert_clean_error(_run("generate", "Once upon a time " * 100, "--max-new-tokens", "256"), "--max-new-tokens")


def test_prompt_refused_before_the_weights_load(monkeypatch):
    """The context check runs on the tokenizer and the checkpoint's header: no weights read, no GPU touched."""
    load = importlib.import_module("llamafast.load")  # the command imports load_model from it when it runs

    def no_load(*args, **kwargs):
        raise AssertionError("load_model ran before the prompt was checked")

    monkeypatch.setattr(load, "load_model", no_load)
    _assert_clean_error(_run("generate", "Once upon a time " * 100, "--max-new-tokens", "256"), "--max-new-tokens")


def test_corrupt_tokenizer(tmp_path, stories_copies):
    shutil.copytree(stories_copies / "hf", tmp_path / "hf")
    (tmp_path / "hf" / "tokenizer.model").write_bytes(b"garbage")
    _assert_clean_error(_run("generate", "hi", "--model", str(tmp_path / "hf")), "tokenizer")


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--top-p", "0"], "--top-p"),
        (["--temperature", "-1"], "--temperature"),
        (["--max-new-tokens", "0"], "--max-new-tokens"),
        (["--device", "cuda:9"] , "cuda"),
    ],
)
def test_bad_options(args, needle):
    _assert_clean_error(_run("generate", "hi", *args), needle)


@pytest.mark.slow
def test_bench_prefill_on_cpu_tiny():
    r = _run("bench", "prefill", "--random-weights", "--shape", "stories260K", "--prompt-lens", "3,40", "--reps", "2",
             "--chunk", "16", "--device", "cpu", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["chunk"] == 16 and [x["prompt_tokens"] for x in report["results"]] == [3, 40]
    assert all(x["backend"] == "reference" and x["ttft_ms"] > 0 and x["tflop_s"] > 0 for x in report["results"])


@pytest.mark.parametrize("lens,needle", [("a,5", "comma-separated"), ("0", "at least 1"), ("600", "context is 512")])
def test_bench_prefill_bad_lengths(lens, needle):
    _assert_clean_error(_run("bench", "prefill", "--random-weights", "--shape", "stories260K", "--prompt-lens", lens),
                        needle)


def test_bench_random_weights_needs_shape():
    _assert_clean_error(_run("bench", "--random-weights"), "--shape")
    _assert_clean_error(_run("bench", "--random-weights", "--shape", "llama-3"), "unknown shape", "llama-2-7b")


def test_eval_scores_variants_against_the_base(tmp_path):
    """A float32 variant of the float32 base is the same model: KL 0 and full agreement; bf16 differs a little."""
    r = _run("eval", "--prompts", "1", "--tokens", "24", "--variant", "float32", "--variant", "bfloat16", "--json")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    base, same, bf16 = report["results"]
    assert report["tokens"] > 24 and base["perplexity"] > 1 and same["perplexity"] == base["perplexity"]
    assert same["kl_mean"] == 0 and same["top1_agreement"] == 1
    assert 0 < bf16["kl_mean"] < 0.05 and 0.8 < bf16["top1_agreement"] <= 1
    (tmp_path / "t.txt").write_text("Once upon a time, there was a little girl named Lily. She liked to play.")
    r = _run("eval", "--text", str(tmp_path / "t.txt"), "--variant", "fp8_e4m3", "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["source"].startswith("text ")


def test_eval_scores_block_variants_of_a_gguf_s_dequantized_weights(tmp_path):
    """A Q4_1 GGUF's base is its weights dequantized to float; each block variant is quantized from them, and
    Q8_0's 8 bits cost less than Q4_0's 4."""
    from .bad_input_files import gguf

    path = gguf(tmp_path, "Q4_1")
    r = _run("eval", "--model", str(path), "--prompts", "2", "--tokens", "16", "--variant", "q8_0", "--variant",
             "q4_0", "--json")
    assert r.exit_code == 0, r.stderr
    base, q8, q4 = json.loads(r.stdout)["results"]
    assert base["name"] == "base (float32)" and [q8["name"], q4["name"]] == ["q8_0", "q4_0"]
    assert 0 < q8["kl_mean"] < q4["kl_mean"]


def test_eval_text_scores_a_capped_number_of_tokens_with_a_progress_bar(tmp_path, monkeypatch):
    """A long --text is scored up to --tokens (16,384 by default), said on stderr, with a bar per scored piece."""
    import contextlib

    steps = []

    @contextlib.contextmanager
    def recording_bar():
        yield lambda phase, done, total: steps.append((phase, done, total))

    monkeypatch.setattr("llamafast.cli.eval.phase_progress", recording_bar)
    (tmp_path / "t.txt").write_text("Once upon a time, there was a little girl named Lily. She liked to play. " * 40)
    args = ["eval", "--text", str(tmp_path / "t.txt"), "--variant", "float32", "--window", "50", "--json"]
    r = _run(*args, "--tokens", "100")
    assert r.exit_code == 0, r.stderr
    report = json.loads(r.stdout)
    assert report["tokens"] == 2 * 49 and "scoring 100 of the " in r.stderr  # two windows of 50: 49 positions each
    assert steps == [("scoring", 1, 2), ("scoring", 2, 2)]
    total = int(r.stderr.split("scoring 100 of the ")[1].split()[0])
    assert total > 600 and f"its first 100 of {total} tokens" in report["source"]
    assert f"scoring {total} of the {total} tokens" in _run(*args).stderr  # under the default cap: all of it


def test_bench_fp8_alone_when_float_weights_do_not_fit(monkeypatch):
    """bench --random-weights --fp8: float weights that cannot fit give way to FP8 weights made tensor by tensor
    (how Llama-2-70B FP8 runs on one 141 GB GPU), said in one line."""
    weights = importlib.import_module("llamafast.load.weights")
    floats = weights.random_state(MODEL_CONFIGS["stories260K"], torch.device("cpu"), torch.float32)
    fp8 = sum(t.nbytes for t in weights.quantize_state(floats, FP8Format.e5m2).values())
    room = fp8 + max(t.nbytes for t in floats.values()) + 1024  # FP8 and the one float tensor being drawn
    assert sum(t.nbytes for t in floats.values()) > room
    monkeypatch.setattr(weights, "free_memory", lambda device: room)
    r = _run("bench", "--random-weights", "--shape", "stories260K", "--fp8", "--device", "cpu", "--backend", "reference",
             "--new-tokens", "4", "--json")
    assert r.exit_code == 0, r.stderr
    assert "timing fp8_e5m2 weights alone" in r.stderr
    assert [row["weights"] for row in json.loads(r.stdout)["results"]] == ["fp8_e5m2"]


@pytest.mark.parametrize("fits", [False, True], ids=["float-fits-alone", "both-fit"])
def test_bench_fp8_decides_from_what_both_need(monkeypatch, fits):
    """The float weights fit but their FP8 copy beside them does not (Llama-2-70B on one H200: 138 of 150 GB, then
    69 more): FP8 alone, decided before either is built; where both fit, both are timed."""
    weights = importlib.import_module("llamafast.load.weights")
    config = MODEL_CONFIGS["stories260K"]
    floats = weights.model_bytes(config, torch.float32)
    monkeypatch.setattr(weights, "free_memory", lambda device: 10 * floats if fits else floats + 1)
    assert (weights.float_and_fp8_fit(config, torch.float32, FP8Format.e5m2, torch.device("cpu")) is None) == fits
    r = _run("bench", "--random-weights", "--shape", "stories260K", "--fp8", "--device", "cpu", "--backend", "reference",
             "--new-tokens", "4", "--json")
    assert r.exit_code == 0, r.stderr
    assert ("together" in r.stderr and "timing fp8_e5m2 weights alone" in r.stderr) != fits
    expected = ["float32", "fp8_e5m2"] if fits else ["fp8_e5m2"]
    assert [row["weights"] for row in json.loads(r.stdout)["results"]] == expected
