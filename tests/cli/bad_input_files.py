"""The files the bad-input cases (bad_inputs.py) are run on: small checkpoints in every format, written under a
test's tmp folder from tests/formats.py's writers or the bundled stories260K, each with one thing wrong."""

from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from llamafast.load import bundled_model

from ..formats import meta_state, write_hf, write_meta

TOK512 = bundled_model().with_name("tok512.model")
SMALL = {
    "dim": 32,
    "n_layers": 2,
    "n_heads": 4,
    "n_kv_heads": 2,
    "vocab_size": 512,
    "multiple_of": 8,
    "max_seq_len": 64,
}


# --- checkpoint writers for the cases --------------------------------------------------------------------------


def hf(tmp: Path, **config_changes) -> Path:
    from llamafast.config import ModelConfig

    config = ModelConfig(**SMALL)
    write_hf(tmp / "hf", config, meta_state(config), tokenizer=TOK512)
    cfg = json.loads((tmp / "hf" / "config.json").read_text())
    for key, value in config_changes.items():
        if value is DROP:
            cfg.pop(key, None)
        else:
            cfg[key] = value
    (tmp / "hf" / "config.json").write_text(json.dumps(cfg))
    return tmp / "hf"


DROP = object()
# Rank 0's environment of a two-rank torchrun (nothing listens at the port: a case is refused before connecting).
RANK0_OF_2 = {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29599"}


def meta(tmp: Path, **param_changes) -> Path:
    from llamafast.config import ModelConfig

    config = ModelConfig(**SMALL)
    write_meta(tmp / "meta", config, meta_state(config), tokenizer=TOK512)
    params = json.loads((tmp / "meta" / "params.json").read_text())
    params.update(param_changes)
    (tmp / "meta" / "params.json").write_text(json.dumps(params))
    return tmp / "meta"


def file(tmp: Path, name: str, data: bytes) -> Path:
    (tmp / name).write_bytes(data)
    return tmp / name


def directory(tmp: Path, name: str) -> Path:
    (tmp / name).mkdir()
    return tmp / name


def bin_header(tmp: Path, ints: tuple[int, ...], size: int | None = None, magic: bool = False) -> Path:
    """A llama2.c file with the given header ints (v0, or v1 after the magic), padded with zeros to `size`."""
    head = (
        struct.pack("<Ii", 0x616B3432, 1) + struct.pack("<7i", *ints) + b"\x01" if magic else struct.pack("<7i", *ints)
    )
    head = head + b"\0" * (256 - len(head)) if magic else head
    return file(tmp, "model.bin", head + b"\0" * max(0, (size or 0) - len(head)))


class Payload:
    """A pickled object whose unpickling would create a file: proof that nothing from the file ran."""

    def __reduce__(self):
        return (os.makedirs, (os.path.join(tempfile.gettempdir(), "llamafast-pickle-ran"),))


def pickle_pth(tmp: Path) -> list[str]:
    folder = meta(tmp)
    torch.save({"tok_embeddings.weight": Payload()}, folder / "consolidated.00.pth")
    return ["hi", "--model", str(folder)]


def copy_bundled(tmp: Path) -> Path:
    shutil.copy(bundled_model(), tmp / "stories.bin")
    shutil.copy(TOK512, tmp / "tokenizer.model")
    return tmp / "stories.bin"


CALIBRATION = Path(__file__).resolve().parents[1] / "data" / "stories260K_calibration.txt"


def sparsified(tmp: Path, src: Path | None = None) -> Path:
    """src (default: the bundled stories260K) sparsified."""
    from llamafast.tools.sparsify import sparsify

    sparsify(src or bundled_model(), tmp / "sparse", CALIBRATION.read_text(), "calibration", 0.5, group_size=4,
             device=torch.device("cpu"))
    return tmp / "sparse"


def sparsify_args(tmp: Path, *extra: str, text: Path = CALIBRATION) -> list[str]:
    return [str(bundled_model()), str(tmp / "out"), "--text", str(text), "--device", "cpu", *extra]


def converted(tmp: Path) -> Path:
    from llamafast.tools.convert import convert_fp8

    convert_fp8(bundled_model(), tmp / "fp8", device=torch.device("cpu"))
    return tmp / "fp8"


BLOCKABLE = {**SMALL, "multiple_of": 32}  # rows of whole 32-weight blocks: dim 32, FFN width 96


def blockable(tmp: Path, tokenizer_json: bytes | None = None) -> Path:
    """A float Meta checkpoint whose rows are whole 32-weight blocks; with tokenizer_json, a Hugging Face one
    with that tokenizer.json (and a tokenizer_config.json naming </s> as EOS) instead of tokenizer.model."""
    from llamafast.config import ModelConfig

    config = ModelConfig(**BLOCKABLE)
    if tokenizer_json is None:
        write_meta(tmp / "float", config, meta_state(config), tokenizer=TOK512)
        return tmp / "float"
    write_hf(tmp / "float", config, meta_state(config))
    (tmp / "float" / "tokenizer.json").write_bytes(tokenizer_json)
    (tmp / "float" / "tokenizer_config.json").write_text(json.dumps({"eos_token": "</s>"}))
    return tmp / "float"


def metaspace_tokenizer() -> bytes:
    """A SentencePiece-style BPE tokenizer.json (Metaspace pre-tokenizer, as Llama 2's Hugging Face files have)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    tok = Tokenizer(models.BPE({"<unk>": 0, "</s>": 1, "\u2581": 2, "a": 3, "\u2581a": 4}, [("\u2581", "a")],
                               unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    return tok.to_str().encode()


def quantized(tmp: Path) -> Path:
    """blockable()'s checkpoint quantized to Q4_0 (llamafast quantize)."""
    from llamafast.config import WeightFormat
    from llamafast.tools.quantize import quantize_checkpoint

    quantize_checkpoint(blockable(tmp), tmp / "q4_0", WeightFormat.q4_0, device=torch.device("cpu"))
    return tmp / "q4_0"


def gguf(tmp: Path, kind: str = "F32", arch: str = "llama", chat_template: str | int | None = None,
          kinds: dict[str, str] | None = None, **special: int | None) -> Path:
    from llamafast.config import ModelConfig

    from ..gguf_models.gguf_files import write_gguf

    config = ModelConfig(**{**SMALL, "multiple_of": 32})  # rows of whole 32-value quant blocks
    write_gguf(tmp / "m.gguf", config, meta_state(config), kind, arch, chat_template, special=special, kinds=kinds)
    return tmp / "m.gguf"


def gguf_nan(tmp: Path) -> Path:
    """A GGUF file with one NaN in layer 1's down projection (the rest is a working model)."""
    from llamafast.config import ModelConfig

    from ..gguf_models.gguf_files import write_gguf

    config = ModelConfig(**{**SMALL, "multiple_of": 32})
    state = meta_state(config)
    state["layers.1.feed_forward.w2.weight"][3, 5] = float("nan")
    write_gguf(tmp / "m.gguf", config, state, chat_template="{{ messages[-1]['content'] }}")  # chat needs one
    return tmp / "m.gguf"


def hf_tokenizer_config(tmp: Path, config: dict | None) -> Path:
    """A Hugging Face checkpoint with a working tokenizer.json (a GGUF file's byte-level vocabulary) and this
    tokenizer_config.json (None: none)."""
    from llamafast.load import open_model

    tok = open_model(gguf(tmp), None).tokenizer
    folder = hf(tmp)
    (folder / "tokenizer.model").unlink()
    tok.tok.save(str(folder / "tokenizer.json"))
    if config is not None:
        (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


def chat(template) -> Callable[[Path], list[str]]:
    return lambda t: ["hi", "--chat", "--model", str(gguf(t, chat_template=template))]


def hf_json_tokenizer(tmp: Path, data: bytes) -> Path:
    """A Hugging Face checkpoint with a tokenizer.json instead of tokenizer.model."""
    folder = hf(tmp)
    (folder / "tokenizer.model").unlink()
    (folder / "tokenizer.json").write_bytes(data)
    return folder


def preset(tmp: Path, text: str | bytes) -> Path:
    path = tmp / "preset.toml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path




def truncate(path: Path, n: int) -> Path:
    path.write_bytes(path.read_bytes()[:n])
    return path


def untied_without_head(tmp: Path) -> Path:
    folder = hf(tmp)
    from safetensors.torch import load_file, save_file

    tensors = load_file(folder / "model.safetensors")
    del tensors["lm_head.weight"]
    save_file(tensors, folder / "model.safetensors")
    return folder


# --- serve ------------------------------------------------------------------------------------------------------

_HELD: list[socket.socket] = []  # listening sockets kept open while the cases run


def busy_port(tmp: Path) -> list[str]:
    """serve's arguments for a port another socket already listens on."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen(1)
    _HELD.append(held)
    return ["--port", str(held.getsockname()[1]), "--device", "cpu"]
