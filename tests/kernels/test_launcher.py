"""The prefill kernels' direct launches (launcher.py): the key that picks a compiled kernel, and on the GPU the
same bits as triton's own launch path, including after a change that triton specializes on."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch
from llamafast.bench.prefill_registry import PREFILL

from llamafast import reference

from .common import DEVICE, ODD

launcher = importlib.import_module("llamafast.kernels.prefill.launcher")
rows = importlib.import_module("llamafast.kernels.prefill.rmsnorm_rows")
tiles = importlib.import_module("llamafast.kernels.prefill.tiles")


def test_key_tells_apart_what_triton_specializes_on():
    buf = torch.zeros(64, dtype=torch.float16)
    key = launcher._arg_key
    assert key(buf[:32]) != key(buf[1:33])  # 16-byte aligned or not
    assert key(buf[:32]) != key(buf[:32].float())  # dtype
    assert key(buf[:32]) == key(buf[8:40])  # 16 bytes further: the same kernel
    assert len({key(1), key(16), key(17), key(2**31)}) == 4  # one, multiple of 16, neither, 64-bit
    assert key(32) == key(4096) and key(17) == key(4097)
    assert key(True) != key(1) and key(0.5) == key(2.0)
    with pytest.raises(TypeError):
        key(object())  # anything else: triton's own path
    from triton.tools.tensor_descriptor import TensorDescriptor

    x = torch.zeros(64, 128, dtype=torch.float16)
    desc = TensorDescriptor.from_tensor
    assert key(desc(x, [16, 32])) == key(desc(x[16:], [16, 32]))  # base, shape and strides are arguments
    assert len({key(desc(x, [16, 32])), key(desc(x, [32, 32])), key(desc(x.float(), [16, 32])),
                key(desc(x, [16, 32], padding="nan"))}) == 4  # block shape, dtype, padding: compiled in


def _outputs(name: str, args: tuple, kw: dict) -> list[torch.Tensor]:
    spec = PREFILL[name]
    out = spec.kernel(*args, **kw)
    return [out, *args[6:8]] if name == "prefill_qkv_rope" else [out]  # q and the caches it wrote


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(PREFILL))
def test_direct_launch_matches_triton_launch(name, monkeypatch):
    """Direct launches run the very kernel triton would: the outputs agree bit for bit, twice over."""
    args, kw = PREFILL[name].make_inputs(ODD, torch.bfloat16, DEVICE, 70, 19, None)
    _assert_direct_equals_triton_path(name, args, kw, monkeypatch)


def _assert_direct_equals_triton_path(name, args, kw, monkeypatch):
    monkeypatch.setattr(launcher, "_KNOBS", None)  # triton without knobs: every launch takes its own path
    want = [t.clone() for t in _outputs(name, args, kw)]
    monkeypatch.undo()
    for _ in range(3):  # the first call may fill the launcher's cache through triton's path; the rest go direct
        got = _outputs(name, args, kw)
        for g, w in zip(got, want):
            assert torch.equal(g, w)


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["prefill_linear_residual[w2]", "prefill_swiglu", "prefill_qkv_rope"])
def test_direct_launch_with_host_descriptors_matches_triton_launch(name, monkeypatch):
    """From HOST_DESCRIPTOR_ROWS rows the matmuls take tensor descriptors made on the host: launched directly,
    the same bits as through triton's path, and the launcher keeps the compiled kernel."""
    m = tiles.HOST_DESCRIPTOR_ROWS + 37
    args, kw = PREFILL[name].make_inputs(dataclasses.replace(ODD, max_seq_len=2 * m), torch.bfloat16, DEVICE, m, 0,
                                         None)
    assert tiles.operands(args[0], [torch.empty(64, args[0].shape[1], dtype=torch.bfloat16, device=DEVICE)],
                          tiles.TileConfig(64, 64, 64, 4, 3))[1] == 1, "host descriptors at this length"
    _assert_direct_equals_triton_path(name, args, kw, monkeypatch)
    from triton.tools.tensor_descriptor import TensorDescriptor

    kept = [key for mod in ("tiles", "prefill_swiglu", "prefill_qkv_rope")
            for v in vars(importlib.import_module(f"llamafast.kernels.prefill.{mod}")).values()
            if isinstance(v, launcher.Launcher) for key in v.compiled]
    assert any(isinstance(a, tuple) and a[0] is TensorDescriptor for key in kept for a in key[1])


@pytest.mark.gpu
def test_misaligned_rows_get_their_own_kernel():
    """A view 2 bytes into its storage is not 16-byte aligned: the launcher must not reuse the aligned kernel."""
    m, k = 37, 96
    buf = torch.randn(m * k + 8, device=DEVICE, dtype=torch.bfloat16)
    g = torch.randn(k, device=DEVICE, dtype=torch.bfloat16)
    aligned, shifted = buf[: m * k].view(m, k), buf[1 : 1 + m * k].view(m, k)
    for x in (aligned, aligned, shifted, shifted, aligned):
        torch.testing.assert_close(rows.rmsnorm_rows(x, g, 1e-5), reference.rmsnorm(x, g, 1e-5), atol=1.6e-2,
                                   rtol=1.6e-2)
    firsts = {key[1][0] for key in rows._RMSNORM_ROWS.compiled}
    assert (torch.bfloat16, True) in firsts and (torch.bfloat16, False) in firsts


def test_registered_hooks_take_triton_path():
    """A profiler's launch hook must see every launch, so the launcher steps aside while one is registered."""
    from triton.knobs import HookChain

    class Runtime:
        launch_enter_hook, launch_exit_hook = HookChain(), HookChain(reversed=True)

    assert not launcher._hooked(Runtime)
    Runtime.launch_enter_hook.add(print)
    assert launcher._hooked(Runtime)
    Runtime.launch_enter_hook, Runtime.launch_exit_hook = None, print  # older triton: plain callables or None
    assert launcher._hooked(Runtime)
    Runtime.launch_exit_hook = None
    assert not launcher._hooked(Runtime)
