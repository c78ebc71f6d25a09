"""Every kernel's Triton cache key is the same in every process (kernels/_common.settle_cache_keys), whatever
the process computed first, so that one process finds what another compiled in Triton's disk cache."""

from __future__ import annotations

import json
import os
import subprocess
import sys

# Prints {function: cache key} for every compiled (not interpreted) Triton function of llamafast.kernels, having
# first computed the keys of the modules' functions in the order asked for.
PROBE = """
import importlib, json, pkgutil, sys
from triton.runtime.jit import JITFunction
names = sorted(m.name for m in pkgutil.walk_packages(importlib.import_module("llamafast.kernels").__path__,
                                                     "llamafast.kernels."))
modules = [importlib.import_module(n) for n in names]
functions = [(f"{m.__name__}.{k}", v) for m in modules for k, v in sorted(vars(m).items()) if isinstance(v, JITFunction)]
for _, fn in (functions if sys.argv[1] == "forward" else functions[::-1]):
    fn.cache_key
print(json.dumps({name: fn.cache_key for name, fn in functions}))
"""


def keys(order: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", PROBE, order], env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.splitlines()[-1])


def test_every_kernel_has_one_cache_key_whatever_was_computed_first():
    forward, backward = keys("forward"), keys("backward")
    assert len(forward) > 50 and forward == backward
