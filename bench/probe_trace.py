"""The package files one traced `loss_scaled(optax.adam(1e-3)).update` enters."""

from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import optax

import jax_amp_scale
from jax_amp_scale.optax import loss_scaled


def files_entered(fn, *args) -> list[str]:
    """The package files whose functions run while `fn(*args)` is traced,
    relative to the package folder, sorted."""
    package = Path(jax_amp_scale.__file__).resolve().parent
    seen: set[str] = set()

    def tracer(frame, event, arg):
        if event == "call" and frame.f_code.co_name != "<module>":
            seen.add(frame.f_code.co_filename)

    sys.settrace(tracer)
    try:
        jax.make_jaxpr(lambda *a: fn(*a))(*args)  # a fresh function: traced anew
    finally:
        sys.settrace(None)
    paths = (Path(f).resolve() for f in seen if not f.startswith("<"))
    return sorted(str(p.relative_to(package)) for p in paths if p.is_relative_to(package))


def main() -> None:
    params = {"w": jnp.ones((4, 3)), "b": jnp.zeros(3)}
    tx = loss_scaled(optax.adam(1e-3))
    args = (params, tx.init(params), params)
    jax.jit(tx.update).lower(*args)  # imports and caches out of the count
    files = files_entered(tx.update, *args)
    print(f"package files entered: {len(files)}", *(f"  {f}" for f in files), sep="\n")


if __name__ == "__main__":
    main()
