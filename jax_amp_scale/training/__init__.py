"""The training layer: scalers, loss-scaling helpers, optax, Trainer, policies.

Built on the operators (`jax_amp_scale.ops`) and the state; it never
reaches the lowering or the platforms.
"""
