"""What the operators share, one module each: float bits (floats), custom-call
plumbing (custom_call), native handlers and their registration (handlers),
sharding groups and JAX internals (jax_internals)."""
