"""torch GradScaler.state_dict() import/export, against real torch."""

import jax.numpy as jnp
import numpy as np
import pytest

import jax_amp_scale as jas
from jax_amp_scale.interop import TORCH_KEYS, from_torch_state_dict, to_torch_state_dict

torch = pytest.importorskip("torch")

SEQ = [False] * 5 + [True] + [False] * 7 + [True, True] + [False] * 9 + [True] + [False] * 4


def torch_step(scaler, found):
    """One real GradScaler step on CPU whose gradient is finite or not."""
    p = torch.nn.Parameter(torch.ones(1))
    opt = torch.optim.SGD([p], lr=0.0)
    loss = (p * (float("inf") if found else 1.0)).sum()
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()


def jax_run(state, seq):
    for f in seq:
        state = jas.update_scale(state, f)
    return state


def make_torch(**kw):
    return torch.amp.GradScaler("cpu", **kw)


def test_torch_export_import_then_both_step_equal():
    scaler = make_torch(
        init_scale=2.0**10, growth_factor=2.0, backoff_factor=0.5, growth_interval=3
    )
    for f in SEQ[:8]:  # leave torch mid-way through a growth interval
        torch_step(scaler, f)
    sd = scaler.state_dict()
    assert set(sd) == set(TORCH_KEYS)
    state = from_torch_state_dict(sd)
    assert float(state.scale) == sd["scale"] and int(state.growth_tracker) == sd["_growth_tracker"]
    for f in SEQ[8:]:
        torch_step(scaler, f)
        state = jas.update_scale(state, f)
        assert to_torch_state_dict(state) == scaler.state_dict()


def test_jax_export_torch_import_then_both_step_equal():
    kind = jas.dynamic_scaler(2.0**12, 2.0, 0.25, 4)
    state = jax_run(kind.scale_state, SEQ[:10])
    scaler = make_torch()
    scaler.load_state_dict(to_torch_state_dict(state))
    for f in SEQ[10:]:
        torch_step(scaler, f)
        state = jas.update_scale(state, f)
    assert to_torch_state_dict(state) == scaler.state_dict()
    assert scaler.get_growth_interval() == 4 and scaler.get_backoff_factor() == 0.25


def test_export_from_wrappers_and_tensor_values():
    optax = pytest.importorskip("optax")
    from jax_amp_scale.optax import loss_scaled

    st = loss_scaled(optax.sgd(1.0), jas.dynamic_scaler(8.0, growth_interval=5)).init(
        {"w": jnp.ones(1)}
    )
    sd = to_torch_state_dict(st)
    assert sd == {
        "scale": 8.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 5,
        "_growth_tracker": 0,
    }
    sd_t = {
        **sd,
        "scale": torch.tensor([8.0]),
        "_growth_tracker": torch.tensor(3, dtype=torch.int32),
    }
    s = from_torch_state_dict(sd_t, dtype=jnp.float16, shape=(1,))
    assert s.scale.dtype == jnp.float16 and s.scale.shape == (1,)
    assert int(s.growth_tracker[0]) == 3 and s.growth_interval == 5
    np.testing.assert_array_equal(s.scale, [8.0])


def test_bad_state_dicts():
    good = {
        "scale": 8.0,
        "growth_factor": 2.0,
        "backoff_factor": 0.5,
        "growth_interval": 5,
        "_growth_tracker": 0,
    }
    with pytest.raises(ValueError, match="disabled"):
        from_torch_state_dict({})
    with pytest.raises(TypeError, match="mapping"):
        from_torch_state_dict([1, 2])
    with pytest.raises(TypeError, match="scale"):
        from_torch_state_dict({**good, "scale": "big"})
    with pytest.raises(ValueError, match="growth_interval"):
        from_torch_state_dict({**good, "growth_interval": 0})
    with pytest.raises(TypeError, match="growth_interval"):
        from_torch_state_dict({**good, "growth_interval": 2.5})
    with pytest.raises(ValueError, match="_growth_tracker"):
        from_torch_state_dict({**good, "_growth_tracker": 2**40})
    with pytest.raises(ValueError, match="one number"):
        from_torch_state_dict({**good, "scale": torch.ones(2)})
    with pytest.raises(ValueError, match="non-finite"):
        to_torch_state_dict(jas.ScaleState(scale=jnp.float32(np.inf), growth_tracker=jnp.int32(0)))
    with pytest.raises(ValueError, match="exactly one"):
        to_torch_state_dict({"a": 1})
