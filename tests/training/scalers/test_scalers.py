"""Scalers: dynamic (bounds, hysteresis), static and no-op; the old names."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_amp_scale as jas
from tests._rule import dynamic_kind_rule as python_rule


def test_defaults_equal_torch_gradscaler():
    k = jas.dynamic_scaler()
    s = k.scale_state
    assert float(s.scale) == 2.0**16 and s.scale.dtype == jnp.float32
    assert (s.growth_factor, s.backoff_factor, s.growth_interval) == (2.0, 0.5, 2000)
    assert int(s.growth_tracker) == 0
    assert (k.min_scale, k.max_scale, k.hysteresis) == (None, None, 1)
    assert k.drop_overflow_update is True


def test_defaults_equal_real_torch():
    torch = pytest.importorskip("torch")
    g = torch.amp.GradScaler("cpu")
    s = jas.dynamic_scaler().scale_state
    assert g.get_scale() == float(s.scale)
    assert g.get_growth_factor() == s.growth_factor
    assert g.get_backoff_factor() == s.backoff_factor
    assert g.get_growth_interval() == s.growth_interval


KINDS = [
    jas.dynamic_scaler(
        1024.0,
        3.0,
        0.25,
        7,
        min_scale=2.0,
        max_scale=4096.0,
        hysteresis=3,
        dtype=jnp.float16,
        shape=(1,),
    ),
    jas.dynamic_scaler(),
    jas.static_scaler(128.0, drop_overflow_update=False, dtype=jnp.bfloat16),
    jas.static_scaler(1000.0),
    jas.no_op_scaler(drop_overflow_update=False),
]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: type(k).__name__)
def test_every_field_survives_jit(kind):
    out = jax.jit(lambda k: k)(kind)
    assert type(out) is type(kind)
    for f in dataclasses.fields(kind):
        a, b = getattr(kind, f.name), getattr(out, f.name)
        if isinstance(a, jas.ScaleState):
            for g in dataclasses.fields(a):
                x, y = getattr(a, g.name), getattr(b, g.name)
                if isinstance(x, jax.Array):
                    assert x.dtype == y.dtype and x.shape == y.shape
                    np.testing.assert_array_equal(x, y)
                else:
                    assert x == y, g.name
        elif isinstance(a, jax.Array):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)
        else:
            assert a == b, f.name
    # also through a traced adjust: static fields stay, leaf dtypes stay
    adj = jax.jit(lambda k: k.update(True))(kind)
    assert jax.tree_util.tree_structure(adj) == jax.tree_util.tree_structure(kind)
    for x, y in zip(jax.tree_util.tree_leaves(adj), jax.tree_util.tree_leaves(kind), strict=True):
        assert x.dtype == y.dtype and x.shape == y.shape


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: type(k).__name__)
def test_one_interface_and_one_scale_state(kind):
    assert isinstance(kind, jas.Scaler)
    assert jas.find_scale_state(kind) is kind.scale_state
    tree = {"w": jnp.array([2.0, 4.0], jnp.float32)}
    scaled = kind.scale_loss(tree)
    back, found = kind.unscale_and_check(scaled)
    np.testing.assert_array_equal(back["w"], tree["w"])  # exact for these scales
    np.testing.assert_array_equal(kind.unscale(scaled)["w"], tree["w"])
    assert not bool(found)


def run_scan(kind, seqs):
    """adjust over each row of `seqs` (bool [n, steps]) in one jitted vmap(scan)."""

    def one(seq):
        def body(k, f):
            k = k.update(f)
            return k, (k.scale, k.scale_state.growth_tracker, k.hysteresis_left)

        return jax.lax.scan(body, kind, seq)[1]

    s, t, h = jax.jit(jax.vmap(one))(jnp.asarray(seqs))
    return [
        list(zip(a.tolist(), b.tolist(), c.tolist(), strict=True))
        for a, b, c in zip(s, t, h, strict=True)
    ]


def random_seqs(seed, n=16, steps=30):
    rng = np.random.default_rng(seed)
    return rng.random((n, steps)) < rng.uniform(0.1, 0.6, size=(n, 1))


def test_dynamic_without_options_is_the_core_rule():
    seqs = random_seqs(0)
    got = run_scan(jas.dynamic_scaler(8.0, 2.0, 0.5, 3), seqs)
    core = jax.jit(
        jax.vmap(
            lambda seq: jax.lax.scan(
                lambda s, f: (jas.update_scale(s, f, "reference"),) * 2,
                jas.init_scale_state(8.0, 2.0, 0.5, 3),
                seq,
            )[1]
        )
    )(jnp.asarray(seqs))
    for i in range(len(seqs)):
        assert [(a, b) for a, b, _ in got[i]] == list(
            zip(core.scale[i].tolist(), core.growth_tracker[i].tolist(), strict=True)
        )


@pytest.mark.parametrize(
    "hyst, lo, hi",
    [
        (1, None, None),
        (3, None, None),
        (2, 4.0, 16.0),
        (1, 1.0, 64.0),
        (4, 4.0, None),
        (1, None, 16.0),
    ],
)
def test_bounds_and_hysteresis_follow_the_documented_rule(hyst, lo, hi):
    seqs = random_seqs(hyst * 7 + int(lo or 0))
    kind = jas.dynamic_scaler(8.0, 2.0, 0.5, 2, min_scale=lo, max_scale=hi, hysteresis=hyst)
    got = run_scan(kind, seqs)
    for i, seq in enumerate(seqs.tolist()):
        assert got[i] == python_rule(seq, init=8.0, gf=2.0, bf=0.5, gi=2, lo=lo, hi=hi, hyst=hyst)


def test_hysteresis_golden():
    k = jas.dynamic_scaler(64.0, 2.0, 0.5, 100, hysteresis=3)
    seq = [True, True, True, True, False, True, True, True]
    scales = [s for s, _, _ in run_scan(k, np.array([seq]))[0]]
    # two overflows tolerated, the third and fourth back off; a finite step
    # refills the budget.
    assert scales == [64.0, 64.0, 32.0, 16.0, 16.0, 16.0, 16.0, 8.0]


def test_bounds_golden_float16():
    k = jas.dynamic_scaler(8.0, 2.0, 0.5, 1, min_scale=4.0, max_scale=16.0, dtype=jnp.float16)
    assert jax.jit(lambda k: k.update(True))(k).scale.dtype == jnp.float16
    seq = [False, False, False, True, True, True]
    got = [s for s, _, _ in run_scan(k, np.array([seq]))[0]]
    assert got == [16.0, 16.0, 16.0, 8.0, 4.0, 4.0]


def test_static_and_noop_never_change():
    s = jas.static_scaler(128.0)
    assert s.update(True) is s and s.update(False) is s
    assert float(s.scale) == 128.0 and s.drop_overflow_update
    # the core rule on its state also keeps the scale (factors 1.0)
    assert float(jas.update_scale(s.scale_state, True).scale) == 128.0
    n = jas.no_op_scaler()
    assert n.update(True) is n and float(n.scale) == 1.0 and n.is_identity
    _, found = n.unscale_and_check({"w": jnp.array([np.nan])})
    assert bool(found)


def test_adjust_axis_name_or_reduces():
    k = jas.dynamic_scaler(8.0, 2.0, 0.5, 100)
    found = jnp.array([False, True, False])
    out = jax.vmap(lambda f: k.update(f, axis_name="i").scale, axis_name="i")(found)
    np.testing.assert_array_equal(out, [4.0, 4.0, 4.0])


def test_as_scaler():
    from jax_amp_scale.training.scalers import as_scaler

    st_ = jas.init_scale_state(4.0)
    k = as_scaler(st_)
    assert isinstance(k, jas.DynamicScaler) and k.scale_state is st_
    assert isinstance(as_scaler(None), jas.DynamicScaler)
    n = jas.no_op_scaler()
    assert as_scaler(n) is n
    with pytest.raises(TypeError, match="scaler must be"):
        as_scaler(1024.0)


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        (dict(min_scale=8.0, max_scale=4.0), ValueError, "min_scale"),
        (dict(min_scale=2.0**17), ValueError, "init_scale"),
        (dict(max_scale=1.0), ValueError, "init_scale"),
        (dict(min_scale=0.0), ValueError, "min_scale"),
        (dict(max_scale=float("inf")), ValueError, "max_scale"),
        (dict(hysteresis=0), ValueError, "hysteresis"),
        (dict(hysteresis=1.5), TypeError, "hysteresis"),
        (dict(hysteresis=True), TypeError, "hysteresis"),
        (dict(growth_interval=0), ValueError, "growth_interval"),
        (dict(dtype=jnp.int32), TypeError, "dtype"),
        (dict(min_scale=jnp.float32(1.0)), TypeError, "min_scale"),
    ],
)
def test_dynamic_bad_input(kwargs, err, match):
    with pytest.raises(err, match=match):
        jas.dynamic_scaler(**kwargs)


def test_dynamic_float16_init_scale_is_rounded_as_documented():
    # The init scale is rounded to the scale's dtype and checked after: in
    # float16, 65519 is kept as 65504 and 65520 rounds to inf.  The docstring
    # used to say "at most 65504", which the code never enforced.
    assert float(jas.dynamic_scaler(65519.0, dtype=jnp.float16).scale) == 65504.0
    with pytest.raises(ValueError, match=r"^init_scale=65520.0 is not finite in float16"):
        jas.dynamic_scaler(65520.0, dtype=jnp.float16)
    doc = " ".join(jas.dynamic_scaler.__doc__.split())
    assert "at most 65504" not in doc
    assert "rounded to `dtype`" in doc and "below 65520" in doc and "become 65504" in doc


def test_dynamic_max_scale_must_fit_dtype():
    with pytest.raises(ValueError, match="max_scale"):
        jas.dynamic_scaler(1024.0, dtype=jnp.float16, max_scale=1e6)


@pytest.mark.parametrize("bad", [0.0, -1.0, float("nan"), float("inf")])
def test_static_bad_scale_names_the_argument(bad):
    """Issue 24's trap 3: the message names `scale`, the argument passed."""
    with pytest.raises(ValueError, match=r"^scale must be a finite number > 0"):
        jas.static_scaler(bad)


def test_static_bad_input():
    with pytest.raises(ValueError, match=r"^scale=65536.0 is not finite in float16"):
        jas.static_scaler(2.0**16, dtype=jnp.float16)
    with pytest.raises(TypeError, match="drop_overflow_update"):
        jas.static_scaler(8.0, drop_overflow_update="yes")
    with pytest.raises(TypeError, match="found_inf"):
        jas.static_scaler(8.0).update("x")


@pytest.mark.parametrize("scaler", KINDS, ids=lambda k: type(k).__name__)
def test_jmp_style_adjust_raises_with_the_fix(scaler):
    """jmp's ``adjust(grads_finite)`` has the opposite flag: never silently inverted."""
    with pytest.raises(TypeError, match=r"scaler.update\(~grads_finite\)"):
        scaler.adjust(jnp.array(True))
    with pytest.raises(TypeError, match=r"GOOD step"):
        jax.jit(lambda s: s.adjust(True))(scaler)


def test_update_has_torch_polarity():
    s = jas.dynamic_scaler(8.0, growth_interval=1)
    assert float(s.update(True).scale) == 4.0  # found_inf: back off
    assert float(s.update(False).scale) == 16.0
    grads_finite = jnp.array(False)  # jmp's flag for an overflow step
    assert float(s.update(~grads_finite).scale) == 4.0


def test_public_surface():
    """About 29 names, and dir() shows nothing else (no importlib, Any, subpackages)."""
    import jax_amp_scale.optax  # noqa: F401  (a loaded subpackage must not show either)

    assert len(jas.__all__) == 29 and len(set(jas.__all__)) == 29
    assert dir(jas) == sorted([*jas.__all__, "__version__"])
    for name in jas.__all__:
        assert getattr(jas, name) is not None
    for hidden in ("importlib", "Any", "training", "ops", "state", "dispatch"):
        assert hidden not in dir(jas)
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        jas.nothing  # noqa: B018
