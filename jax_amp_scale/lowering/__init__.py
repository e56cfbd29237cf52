"""The XLA FFI lowering: custom calls to the native handlers, per platform.

`custom_call` holds the machinery both operators share (per-platform
branches, shard_map varying axes, vmap/jvp rules, the "unavailable" error);
`update_scale` and `gradient_pass` are the two custom calls.
"""
