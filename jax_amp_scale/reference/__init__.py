"""The pure-JAX reference lowering: the rule and the gradient pass in jax.numpy/lax.

Runs on every JAX platform; the native handlers are tested against it bit for bit.
"""
