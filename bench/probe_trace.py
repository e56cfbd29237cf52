"""What a reader follows: one jitted `loss_scaled` update, traced and counted.

Traces ``loss_scaled(optax.adam(1e-3)).update`` for two float32 leaves on CPU
under ``sys.settrace`` and counts the library's calls, functions and files,
and the switches from one library file to another along the call sequence;
then lowers the same step and counts its custom calls, its case/if ops and
its StableHLO lines.  Issue 31's table reads these numbers.

    python bench/probe_trace.py
"""

from __future__ import annotations

import itertools
import re
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

import jax_amp_scale
from jax_amp_scale.optax import loss_scaled

PACKAGE = str(Path(jax_amp_scale.__file__).resolve().parent)


def traced_calls(fn, *args):
    calls: list[tuple[str, str]] = []

    def tracer(frame, event, arg):
        if event == "call":
            path = str(Path(frame.f_code.co_filename).resolve())
            if path.startswith(PACKAGE):
                calls.append((path[len(PACKAGE) + 1 :], frame.f_code.co_name))
        return None

    sys.settrace(tracer)
    try:
        jax.jit(lambda *a: fn(*a)).trace(*args)  # a fresh function: no cached trace
    finally:
        sys.settrace(None)
    return calls


def main() -> None:
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    tx = loss_scaled(optax.adam(1e-3))
    state = tx.init(params)
    args = (params, state, params)
    jax.jit(tx.update).lower(*args)  # warm: imports and caches out of the count
    calls = traced_calls(tx.update, *args)
    files = [f for f, _ in calls]
    switches = sum(1 for a, b in itertools.pairwise(files) if a != b)
    text = jax.jit(tx.update).lower(*args).as_text()
    rows = {
        "library calls": len(calls),
        "functions": len(set(calls)),
        "files": len(set(files)),
        "switches between files": switches,
        "custom calls": len(re.findall(r"stablehlo\.custom_call", text)),
        "case/if ops": len(re.findall(r"stablehlo\.(case|if)\b", text)),
        "StableHLO lines": len(text.splitlines()),
    }
    width = max(map(len, rows))
    for name, value in rows.items():
        print(f"{name:<{width}}  {value}")
    print("files:", ", ".join(sorted(set(files))))


if __name__ == "__main__":
    main()
