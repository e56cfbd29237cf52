"""Register the native handlers on a PJRT plugin platform (Ascend, CUDA): `register`."""

from jax_amp_scale.platforms.pjrt import PluginRegistrationError, register, registrations

__all__ = ["PluginRegistrationError", "register", "registrations"]
