"""The XLA FFI lowering: custom calls to the native handlers, per platform.

`custom_call` holds the machinery every call shares (per-platform
branches, shard_map varying axes, vmap/jvp rules, the "unavailable" error),
`partitioning` runs the operators' calls per shard, `ffi_calls` holds the
three custom calls, `exporting` lets `jax.export` serialize them.
"""
