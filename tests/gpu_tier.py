"""The GPU tier: the core tests run with JAX on a GPU (bench/gpu_check.sh).

Tests parametrised over ``backend="ffi"`` ask for the native gradient pass,
which has handlers on CPU and Ascend only: off the CPU, the library's own
lowering error says so.  That one error, and only off the CPU, makes the
test a skip that quotes it (tests/conftest.py); any other failure stays one.
"""

from __future__ import annotations

NO_HANDLER = "jax_amp_scale: backend='ffi' has no native"


def missing_native_handler(exc: BaseException | None, backend: str) -> str | None:
    """The library's no-handler message when `exc` (or what it was raised
    from) is that error and JAX's `backend` is not the CPU; else None."""
    if backend == "cpu":
        return None
    while exc is not None:
        if isinstance(exc, NotImplementedError) and str(exc).startswith(NO_HANDLER):
            return str(exc).splitlines()[0]
        exc = exc.__cause__ or exc.__context__
    return None
