"""convert-fp8 and FP8 checkpoints: the written format, atomic writes, loading on the CPU, --fp8 at load."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from llamafast.tools import convert as convert_module
from llamafast.formats import open_checkpoint
from llamafast.cli import app
from llamafast.config import Backend, ModelConfig, SamplingConfig
from llamafast.tools.convert import convert_fp8
from llamafast.errors import LlamafastError
from llamafast.generate import Engine, generate
from llamafast.load import bundled_model, load_model
from llamafast.quant import FP8Format

from .formats import meta_state, write_hf
from .test_triton_backend import _logit_errors

runner = CliRunner()


@pytest.mark.parametrize("fmt", list(FP8Format))
def test_convert_writes_fp8_llamafast_checkpoint(tmp_path, fmt):
    report = convert_fp8(bundled_model(), tmp_path / "out", fmt)
    ckpt = open_checkpoint(tmp_path / "out")
    meta = ckpt.metadata
    assert ckpt.format == "llamafast" and meta["weights"] == f"fp8_{fmt.value}" and meta["weights_version"] == "1"
    assert meta["source"].endswith("stories260K.bin") and meta["source_format"] == "llama2c"
    assert (tmp_path / "out" / "tokenizer.model").is_file()
    t = ckpt.tensors
    assert t["layers.0.attention.wqkv.weight"].dtype == torch.int8 and t["output.weight"].dtype == torch.int8
    assert t["tok_embeddings.weight"].dtype == torch.float32 and t["norm.weight"].dtype == torch.float32
    assert ("layers.0.feed_forward.w1.scale" in t) == (fmt == FP8Format.e4m3)
    assert len(report.stats) == 5 * 5 + 1  # wqkv, wo, w1, w2, w3 per layer; the LM head and report.saturated == 0


def test_keep_lm_head(tmp_path):
    convert_fp8(bundled_model(), tmp_path / "out", keep_lm_head=True)
    ckpt = open_checkpoint(tmp_path / "out")
    assert "output.weight" not in ckpt.tensors  # stories260K's head is tied to the embedding: it stays so
    assert ckpt.metadata["lm_head"] == "kept"


def test_untied_lm_head_kept_in_source_dtype(tmp_path, tiny_config):
    write_hf(tmp_path / "hf", tiny_config, meta_state(tiny_config), dtype=torch.bfloat16)
    (tmp_path / "hf" / "tokenizer.model").write_bytes(bundled_model().with_name("tok512.model").read_bytes())
    convert_fp8(tmp_path / "hf", tmp_path / "out", keep_lm_head=True)
    t = open_checkpoint(tmp_path / "out").tensors
    assert t["output.weight"].dtype == torch.bfloat16 and t["layers.1.feed_forward.w2.weight"].dtype == torch.int8


def test_interrupted_conversion_leaves_nothing(tmp_path, monkeypatch):
    calls = []

    def failing(w, fmt, name=""):
        calls.append(name)
        if len(calls) == 7:
            raise KeyboardInterrupt
        return real(w, fmt, name)

    real = convert_module.quantize_named
    monkeypatch.setattr(convert_module, "quantize_named", failing)
    with pytest.raises(KeyboardInterrupt):
        convert_fp8(bundled_model(), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_refuses_to_overwrite(tmp_path):
    (tmp_path / "out").mkdir()
    with pytest.raises(LlamafastError, match="--force"):
        convert_fp8(bundled_model(), tmp_path / "out")
    r = runner.invoke(app, ["convert-fp8", str(bundled_model()), str(tmp_path / "out")])
    assert r.exit_code == 1 and "error:" in r.stderr and "--force" in r.stderr
    r = runner.invoke(app, ["convert-fp8", str(bundled_model()), str(tmp_path / "out"), "--force", "--json"])
    assert r.exit_code == 0, r.stderr
    assert json.loads(r.stdout)["format"] == "fp8_e5m2"


def test_cli_table_and_fp8_checkpoint_generates(tmp_path):
    r = runner.invoke(app, ["convert-fp8", str(bundled_model()), str(tmp_path / "out"), "--format", "e4m3"])
    assert r.exit_code == 0, r.stderr
    assert "layers.4.feed_forward.w3.weight" in r.stdout and "mean relative error" in r.stderr
    r = runner.invoke(app, ["generate", "Once upon a time", "--model", str(tmp_path / "out"), "--temperature", "0",
                            "--max-new-tokens", "8", "--json"])
    out = json.loads(r.stdout)
    assert out["weights"] == "fp8_e4m3" and len(out["token_ids"]) == 8


def test_fp8_at_load_equals_converted_checkpoint(tmp_path):
    """--fp8 quantizes in memory exactly as convert-fp8 does on disk, on the same device (convert-fp8 quantizes on
    the GPU when there is one, and the GPU's float8 casts may round an element differently from the CPU's)."""
    convert_fp8(bundled_model(), tmp_path / "out", FP8Format.e4m3, device=torch.device("cpu"))
    a = load_model(tmp_path / "out", device=torch.device("cpu")).model
    b = load_model(None, device=torch.device("cpu"), fp8=FP8Format.e4m3).model
    tokens = [1, 403, 407, 261, 378]
    for model in (a, b):
        model.setup_cache(8)
    pos = torch.zeros((), dtype=torch.long)
    torch.testing.assert_close(a(torch.tensor(tokens), pos, True), b(torch.tensor(tokens), pos, True), atol=0, rtol=0)


def test_fp8_flag_refuses_fp8_checkpoint(tmp_path):
    convert_fp8(bundled_model(), tmp_path / "out")
    with pytest.raises(LlamafastError, match="already holds fp8_e5m2"):
        load_model(tmp_path / "out", device=torch.device("cpu"), fp8=FP8Format.e5m2)


@pytest.mark.slow
@pytest.mark.parametrize("fmt", list(FP8Format))
def test_fp8_kernels_in_the_model_match_the_reference(golden, fmt):
    """The triton model's FP8 wiring (weights and scales to each kernel) against the reference path, fp32
    activations on the same FP8 weights; on the CPU through Triton's interpreter."""
    if torch.cuda.is_available():
        pytest.skip("covered on the GPU by the kernel tests and bench")
    lm = load_model(None, device=torch.device("cpu"), fp8=fmt, backend=Backend.reference)
    from llamafast.backends import with_backend

    case = golden["prompt_once_upon_a_time"]
    tokens = case["prompt_ids_with_bos"] + case["continuation_ids"][:4]
    errors = _logit_errors(lm.model, with_backend(lm.model, Backend.triton), tokens, 5)
    assert max(errors) < 1e-5, errors


def test_fp8_greedy_text_stays_close(golden):
    """E4M3 keeps stories260K's greedy text for its first sentence (the quality table has the full numbers)."""
    lm = load_model(None, device=torch.device("cpu"), fp8=FP8Format.e4m3)
    case = golden["prompt_once_upon_a_time"]
    out = generate(Engine(lm.model, SamplingConfig(temperature=0), 69), lm.tokenizer, case["prompt_ids_with_bos"], 64)
    assert out.token_ids[:10] == case["continuation_ids"][:10]


# --- faults: a conversion killed midway, permissions ---------------------------------------------------------

BIG = ModelConfig(dim=768, n_layers=8, n_heads=12, vocab_size=512, multiple_of=256)  # 230 MB in fp32


def _big_source(tmp_path: Path) -> Path:
    write_hf(tmp_path / "src", BIG, meta_state(BIG), tokenizer=bundled_model().with_name("tok512.model"))
    return tmp_path / "src"


def _default_stop_signals() -> None:
    """In the child: the stop signals at their defaults, since an ignored one stays ignored (a test run under nohup
    ignores SIGHUP, and the conversion would rightly finish)."""
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def _start_and_stop(src: Path, dst: Path, stop: Callable[[subprocess.Popen], None]) -> int:
    """Starts a conversion in another process and calls stop(process) once it is writing model.safetensors."""
    proc = subprocess.Popen([sys.executable, "-m", "llamafast", "convert-fp8", str(src), str(dst), "--device", "cpu"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=_default_stop_signals)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        partial = [p / "model.safetensors" for p in dst.parent.glob(f".{dst.name}.llamafast-tmp-*")]
        if any(p.is_file() and p.stat().st_size > 0 for p in partial):
            stop(proc)
            break
        time.sleep(0.002)
    proc.wait(timeout=60)
    assert not dst.exists(), "the conversion finished before it could be stopped: make BIG bigger"
    return proc.returncode


def _temporaries(dst: Path) -> list[Path]:
    return list(dst.parent.glob(f".{dst.name}*"))


@pytest.mark.slow
def test_sigkill_midway_leaves_no_dst_and_the_next_run_cleans_up(tmp_path):
    src, dst = _big_source(tmp_path), tmp_path / "out"
    assert _start_and_stop(src, dst, lambda p: p.kill()) == -signal.SIGKILL
    assert len(_temporaries(dst)) == 1  # SIGKILL cannot be caught: the partial directory stays, marked with its pid
    r = runner.invoke(app, ["convert-fp8", str(src), str(dst), "--device", "cpu", "--json"])
    assert r.exit_code == 0, r.stderr
    assert _temporaries(dst) == [] and open_checkpoint(dst).metadata["weights"] == "fp8_e5m2"


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_sigterm_sighup_or_ctrl_c_midway_removes_everything(tmp_path, sig):
    src, dst = _big_source(tmp_path), tmp_path / "out"
    assert _start_and_stop(src, dst, lambda p: p.send_signal(sig)) == 128 + sig
    assert _temporaries(dst) == []


def _appears_before_the_rename(monkeypatch, make: Callable[[], None]) -> None:
    """make() runs once, after the tokenizer files are written: something appears at DST just before the rename."""
    real, pending = convert_module.tokenizer_writer, [make]

    def writer(ckpt):
        write = real(ckpt)
        return lambda folder: (write(folder), pending and pending.pop()())

    monkeypatch.setattr(convert_module, "tokenizer_writer", writer)


@pytest.mark.parametrize("force", [False, True])
def test_a_directory_made_at_dst_while_converting_is_kept(tmp_path, monkeypatch, force):
    dst = tmp_path / "c4"

    def make():
        dst.mkdir()
        (dst / "notes.txt").write_text("precious")

    _appears_before_the_rename(monkeypatch, make)
    with pytest.raises(LlamafastError, match="appeared" if not force else "no longer a llamafast checkpoint"):
        convert_fp8(bundled_model(), dst, force=force, device=torch.device("cpu"))
    assert (dst / "notes.txt").read_text() == "precious" and [p.name for p in dst.iterdir()] == ["notes.txt"]
    assert list(tmp_path.iterdir()) == [dst]


def test_two_conversions_to_one_dst_one_wins(tmp_path, monkeypatch):
    dst = tmp_path / "c1"
    _appears_before_the_rename(monkeypatch, lambda: convert_fp8(bundled_model(), dst, fmt=FP8Format.e4m3,
                                                                 device=torch.device("cpu")))
    r = runner.invoke(app, ["convert-fp8", str(bundled_model()), str(dst), "--device", "cpu"])
    assert r.exit_code == 1 and "appeared while the checkpoint was written" in r.stderr and "wrote" not in r.stderr
    assert open_checkpoint(dst).metadata["weights"] == "fp8_e4m3"  # the first writer's, untouched
    assert list(tmp_path.iterdir()) == [dst]


def test_force_replaces_the_checkpoint_it_checked(tmp_path, monkeypatch):
    """With --force, a checkpoint another writer put at DST meanwhile is replaced: it too is one --force may replace."""
    dst = tmp_path / "c1"
    convert_fp8(bundled_model(), dst, device=torch.device("cpu"))
    _appears_before_the_rename(monkeypatch, lambda: convert_fp8(bundled_model(), dst, force=True,
                                                                 device=torch.device("cpu")))
    convert_fp8(bundled_model(), dst, fmt=FP8Format.e4m3, force=True, device=torch.device("cpu"))
    assert open_checkpoint(dst).metadata["weights"] == "fp8_e4m3" and list(tmp_path.iterdir()) == [dst]


def test_a_model_directory_whose_name_is_not_utf8(tmp_path):
    """Latin-1 `m\xe9`: safetensors, SentencePiece and the safetensors header take only UTF-8 names."""
    src = Path(os.fsdecode(bytes(tmp_path) + b"/m\xe9"))
    write_hf(src, ModelConfig(**SMALL_HF), meta_state(ModelConfig(**SMALL_HF)),
             tokenizer=bundled_model().with_name("tok512.model"))
    r = runner.invoke(app, ["generate", "hi", "--model", str(src), "--max-new-tokens", "2", "--device", "cpu"])
    assert r.exit_code == 0, r.stderr
    r = runner.invoke(app, ["convert-fp8", str(src), str(tmp_path / "fp8"), "--device", "cpu"])
    assert r.exit_code == 0, r.stderr
    assert open_checkpoint(tmp_path / "fp8").metadata["source"].endswith("m\\xe9")


SMALL_HF = {"dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 512, "multiple_of": 8,
            "max_seq_len": 64}


def test_output_is_readable_by_others(tmp_path):
    """mkdtemp makes 0700 directories; the converted model follows the umask like any other file."""
    old = os.umask(0o022)
    try:
        convert_fp8(bundled_model(), tmp_path / "out", device=torch.device("cpu"))
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755
    assert stat.S_IMODE((tmp_path / "out" / "model.safetensors").stat().st_mode) == 0o644
