"""Train a small network in float16 with dynamic loss scaling: ``python -m jax_amp_scale.demo``.

The task: classify points drawn from a Gaussian into the classes a fixed
random "teacher" network assigns them (data generated here, nothing
downloaded).  The model is an MLP with a LayerNorm, written in plain
jax.numpy so that the demo needs only optax.  Under O2 its matrices and
activations run in float16, the LayerNorm and the softmax in float32, and
the master weights stay float32.

Overflows can be injected at chosen steps (``--inject 100,101``): the
gradient of that step is made infinite in the backward pass, as a real
float16 overflow would be; the step is skipped and the scale backs off.

Next to it, the same model trains in float32 (O0, no scaling) from the same
weights and batches: the baseline.  At the end: a summary table (the loss
over all the data of both runs), and a PNG of loss and scale over the steps
with the baseline's loss drawn dashed (``pip install jax-amp-scale[demo]``
for matplotlib; without it the plot is skipped with a message).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

try:
    import optax
except ImportError:  # pragma: no cover - exercised by hand without the extra
    sys.exit("the demo needs optax: pip install 'jax-amp-scale[demo]'")

import jax_amp_scale as jas
from jax_amp_scale.policy import LEVELS, Policy, get_policy, scaler_for
from jax_amp_scale.trainer import Trainer

DIM, HIDDEN, CLASSES = 32, 128, 8
N_TRAIN = 4096


def make_data(seed: int = 0, n: int = N_TRAIN) -> tuple[np.ndarray, np.ndarray]:
    """Inputs (n, 32) float32 and teacher labels (n,) int32 in [0, 8)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, DIM)).astype(np.float32)
    w1 = rng.standard_normal((DIM, 64)) / np.sqrt(DIM)
    w2 = rng.standard_normal((64, CLASSES)) / 8.0
    y = np.argmax(np.tanh(x @ w1) @ w2, axis=1).astype(np.int32)
    return x, y


def init_params(key: jax.Array) -> dict[str, Any]:
    """MLP parameters, float32: dense_0 -> layer_norm -> relu -> dense_1 -> relu -> dense_2."""
    k0, k1, k2 = jax.random.split(key, 3)

    def dense(k: jax.Array, n_in: int, n_out: int) -> dict[str, jax.Array]:
        w = jax.random.normal(k, (n_in, n_out), jnp.float32) * np.float32(np.sqrt(2.0 / n_in))
        return {"kernel": w, "bias": jnp.zeros((n_out,), jnp.float32)}

    return {
        "dense_0": dense(k0, DIM, HIDDEN),
        "layer_norm": {"scale": jnp.ones((HIDDEN,)), "bias": jnp.zeros((HIDDEN,))},
        "dense_1": dense(k1, HIDDEN, HIDDEN),
        "dense_2": dense(k2, HIDDEN, CLASSES),
    }


def _layer_norm(h: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    # Statistics in float32 whatever the activation dtype; back to it after.
    x = h.astype(jnp.float32)
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    y = (x - mean) * jax.lax.rsqrt(var + 1e-5)
    return (y * p["scale"].astype(jnp.float32) + p["bias"].astype(jnp.float32)).astype(h.dtype)


@jax.custom_vjp
def _poison_grad(x: jax.Array, poison: jax.Array) -> jax.Array:
    """Identity; its gradient becomes inf where `poison` is True (an injected overflow)."""
    return x


def _poison_fwd(x: jax.Array, poison: jax.Array) -> tuple[jax.Array, jax.Array]:
    return x, poison


def _poison_bwd(poison: jax.Array, g: jax.Array) -> tuple[jax.Array, None]:
    return jnp.where(poison, jnp.asarray(jnp.inf, g.dtype), g), None


_poison_grad.defvjp(_poison_fwd, _poison_bwd)


def forward(params: dict[str, Any], x: jax.Array) -> jax.Array:
    """Logits (batch, 8), in the dtype of `x` and the kernels."""
    h = x @ params["dense_0"]["kernel"] + params["dense_0"]["bias"].astype(x.dtype)
    h = jax.nn.relu(_layer_norm(h, params["layer_norm"]))
    h = jax.nn.relu(h @ params["dense_1"]["kernel"] + params["dense_1"]["bias"].astype(h.dtype))
    return h @ params["dense_2"]["kernel"] + params["dense_2"]["bias"].astype(h.dtype)


def loss_fn(params: dict[str, Any], batch: dict[str, jax.Array]) -> jax.Array:
    """Mean softmax cross-entropy, computed in float32 (the spec's advice)."""
    logits = forward(params, batch["x"])
    logits = _poison_grad(logits, batch["poison"]).astype(jnp.float32)
    logp = jax.nn.log_softmax(logits)
    return -jnp.mean(jnp.take_along_axis(logp, batch["y"][:, None], axis=1))


def make_scaler(kind: str, level: str, growth_interval: int) -> Any:
    """The scaler for the ``--scale`` flag (``auto``: what the level pairs with)."""
    if kind == "auto":
        auto = scaler_for(level)
        if isinstance(auto, jas.DynamicScaler):
            return jas.dynamic_scaler(growth_interval=growth_interval)
        return auto
    if kind == "dynamic":
        return jas.dynamic_scaler(growth_interval=growth_interval)
    if kind == "static":
        return jas.static_scaler(1024.0)
    if kind == "none":
        return jas.no_op_scaler()
    raise ValueError(f"scale must be one of auto, dynamic, static, none; got {kind!r}")


class RunResult(NamedTuple):
    """What `train` returns: per-step histories (NumPy) and final values."""

    loss: np.ndarray  # (steps,) float32, the unscaled training loss
    scale: np.ndarray  # (steps,) float32, the scale each step used
    skipped: np.ndarray  # (steps,) bool
    reason: np.ndarray  # (steps,) int32 SkipReason (1 overflow, 2 non-finite update)
    growth_interval: int | None  # of the dynamic scale; None for static/no-op
    params: Any
    opt_state: Any
    eval_loss: float  # float32 loss on the whole training set, after training
    seconds: float


def _progress(
    step: int, total: int, loss: float, scale: float, width: int = 30, stream: Any = None
) -> None:
    """A bar redrawn in place on a terminal; one plain line per call otherwise.

    A log file or a pipe gets whole lines (no carriage returns); `train`
    calls this every 2% of the run on a terminal and every 10% elsewhere.
    """
    stream = sys.stderr if stream is None else stream
    text = f"{step:>5}/{total}  loss {loss:8.4f}  scale {scale:10.4g}"
    if _is_tty(stream):
        done = int(width * step / total)
        bar = "#" * done + "-" * (width - done)
        stream.write(f"\r[{bar}] {text}")
        if step == total:
            stream.write("\n")
    else:
        stream.write(f"step {text}\n")
    stream.flush()


def _is_tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # closed or not a file
        return False


def make_optimizer(level: str, learning_rate: float) -> optax.GradientTransformation:
    """Adam; under O3 with ``eps=1e-3``: the default 1e-8 is 0 in float16.

    With float16 parameters adam's moments are float16: a small gradient's
    square underflows to 0 and ``m / (sqrt(0) + 0)`` is inf, so every step
    would be non-finite.  1e-3 lies well above float16's smallest normal
    (6.1e-5) and trained best of the values tried on this task (1e-4: eval
    loss 0.163, 1e-3: 0.139, float32 O0: 0.123).
    """
    if level.upper() == "O3":
        return optax.adam(learning_rate, eps=1e-3)
    return optax.adam(learning_rate)


def train(
    steps: int = 300,
    level: str = "O2",
    scale: str = "auto",
    inject: Sequence[int] = (),
    *,
    seed: int = 0,
    batch_size: int = 256,
    learning_rate: float = 3e-3,
    growth_interval: int = 50,
    progress: bool = False,
) -> RunResult:
    """Trains the demo model; see the module docstring.

    Args:
      steps: training steps (>= 1).
      level: ``"O0"`` .. ``"O3"`` (`get_policy`).
      scale: ``"auto"``, ``"dynamic"``, ``"static"`` (1024) or ``"none"``.
      inject: steps (0-based) whose gradients are made infinite.
      growth_interval: of the dynamic scale (the demo is short; torch's
        default of 2000 would never grow within it).
    """
    _check_train_arguments(steps, level, inject)
    policy: Policy = get_policy(level)
    scaler = make_scaler(scale, level, growth_interval)
    x, y = make_data(seed)
    params = policy.cast_to_param(init_params(jax.random.PRNGKey(seed)))
    trainer = Trainer(make_optimizer(level, learning_rate), scaler, policy=policy)
    state = trainer.init(params)
    step_fn = jax.jit(trainer.step, static_argnums=3)
    poison_steps = {int(s) for s in inject}
    rng = np.random.default_rng(seed + 1)
    history = []
    t0 = time.perf_counter()
    every = max(1, steps // (50 if _is_tty(sys.stderr) else 10))
    for t in range(steps):
        idx = rng.integers(0, len(x), batch_size)
        batch = {"x": x[idx], "y": y[idx], "poison": np.bool_(t in poison_steps)}
        params, state, metrics = step_fn(params, state, batch, loss_fn)
        history.append({k: metrics[k] for k in ("loss", "scale", "skipped", "reason")})
        if progress and ((t + 1) % every == 0 or t + 1 == steps):
            _progress(t + 1, steps, float(metrics["loss"]), float(metrics["scale"]))
    hist = jax.device_get(history)
    eval_loss = _loss_on_all_data(policy, params, x, y)
    seconds = time.perf_counter() - t0
    return RunResult(
        loss=np.array([h["loss"] for h in hist], np.float32),
        scale=np.array([h["scale"] for h in hist], np.float32),
        skipped=np.array([h["skipped"] for h in hist], bool),
        reason=np.array([h["reason"] for h in hist], np.int32),
        growth_interval=growth_interval if isinstance(scaler, jas.DynamicScaler) else None,
        params=params,
        opt_state=state,
        eval_loss=eval_loss,
        seconds=seconds,
    )


def _check_train_arguments(steps: Any, level: Any, inject: Sequence[int]) -> None:
    """`train`'s arguments, checked before anything is built."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an int >= 1, got {steps!r}")
    if not isinstance(level, str) or level.upper() not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    bad = [s for s in inject if not 0 <= int(s) < steps]
    if bad:
        raise ValueError(f"inject steps must lie in [0, {steps}), got {bad}")


def _loss_on_all_data(policy: Policy, params: Any, x: Any, y: Any) -> float:
    """The trained model's loss on the whole data set (no poisoned step)."""
    full = {"x": x, "y": y, "poison": np.bool_(False)}
    return float(
        jax.jit(lambda p: loss_fn(policy.cast_to_compute(p), policy.cast_to_compute(full)))(params)
    )


def summary_table(
    result: RunResult, *, level: str, scale: str, baseline: RunResult | None = None
) -> str:
    """The end-of-run table, as text; with `baseline`, its loss beside the run's."""
    skipped_at = np.flatnonzero(result.skipped).tolist()
    shown = ", ".join(map(str, skipped_at[:10])) + (" ..." if len(skipped_at) > 10 else "")
    growth = (
        "- (fixed scale)"
        if result.growth_interval is None
        else f"{result.growth_interval} finite steps (scale x2)"
    )
    rows = [
        ("level / scale", f"{level} / {scale}"),
        ("steps", str(len(result.loss))),
        ("skipped", f"{len(skipped_at)}" + (f" (at {shown})" if skipped_at else "")),
        (
            "  of which",
            f"{int(np.sum(result.reason == 1))} overflow, "
            f"{int(np.sum(result.reason == 2))} non-finite update",
        ),
        ("growth interval", growth),
        ("final scale", f"{float(jas.find_scale_state(result.opt_state).scale):g}"),
        ("last loss (batch)", f"{float(result.loss[-1]):.4f}"),
        ("loss (all data)", f"{result.eval_loss:.4f}" + _beside(result, baseline)),
        ("time", f"{result.seconds:.1f} s"),
    ]
    width = max(len(k) for k, _ in rows)
    line = "+" + "-" * (width + 2) + "+" + "-" * 42 + "+"
    out = [line] + [f"| {k:<{width}} | {v:<40} |" for k, v in rows] + [line]
    return "\n".join(out)


def summary_figures(result: RunResult, baseline: RunResult | None = None) -> dict[str, Any]:
    """The summary's figures as plain numbers (``--json``)."""
    out: dict[str, Any] = {
        "steps": len(result.loss),
        "skipped_at": np.flatnonzero(result.skipped).tolist(),
        "final_scale": float(jas.find_scale_state(result.opt_state).scale),
        "last_batch_loss": float(result.loss[-1]),
        "eval_loss": result.eval_loss,
    }
    if baseline is not None:
        out["baseline_eval_loss"] = baseline.eval_loss
    return out


def _beside(result: RunResult, baseline: RunResult | None) -> str:
    if baseline is None:
        return ""
    rel = 100.0 * (result.eval_loss / baseline.eval_loss - 1.0)
    return f" (float32: {baseline.eval_loss:.4f}, {rel:+.1f}%)"


def plot(
    result: RunResult,
    path: str,
    *,
    baseline: RunResult | None = None,
    title: str = "jax-amp-scale demo",
) -> bool:
    """Writes the loss/scale PNG to `path`; False (and a message) without matplotlib.

    `baseline` (a float32 O0 run) is drawn on the loss panel; skipped steps
    are marked on both panels; the title carries the growth interval.
    """
    plt = _pyplot()
    if plt is None:
        return False
    steps = np.arange(len(result.loss))
    fig, (ax1, ax2) = plt.subplots(2, 1, sharex=True, figsize=(7, 5.5))
    ok = ~result.skipped
    ax1.plot(steps[ok], result.loss[ok], lw=1, color="tab:blue", zorder=2, label="loss")
    if baseline is not None:
        # The two curves nearly coincide: the baseline is a wide, light band
        # under the run's thin line, so that both stay visible.
        ax1.plot(
            np.arange(len(baseline.loss)),
            baseline.loss,
            lw=4,
            color="tab:orange",
            alpha=0.5,
            zorder=1,
            label="float32 baseline (O0)",
        )
    for ax in (ax1, ax2):
        for s in steps[result.skipped]:
            ax.axvline(s, color="red", alpha=0.3, lw=1)
    if result.skipped.any():
        ax1.plot([], [], color="red", alpha=0.5, label="skipped step")
    ax1.set_yscale("log")
    ax1.set_ylabel("training loss")
    ax1.legend(loc="upper right")
    ax2.step(steps, result.scale, where="post", label="loss scale")
    ax2.set_yscale("log", base=2)
    ax2.set_ylabel("loss scale")
    ax2.set_xlabel("step")
    growth = (
        "fixed scale"
        if result.growth_interval is None
        else f"scale x2 after {result.growth_interval} finite steps"
    )
    fig.suptitle(f"{title}\n{int(result.skipped.sum())} skipped steps (red); {growth}")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _pyplot() -> Any:
    """matplotlib.pyplot on the Agg backend; None (and a message) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(
            "matplotlib is not installed (pip install 'jax-amp-scale[demo]'): skipping the plot",
            file=sys.stderr,
        )
        return None
    return plt


def _int_list(text: str) -> list[int]:
    if not text.strip():
        return []
    try:
        return [int(s) for s in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _parser() -> argparse.ArgumentParser:
    """The command line of ``python -m jax_amp_scale.demo``."""
    parser = argparse.ArgumentParser(
        prog="python -m jax_amp_scale.demo",
        description="Train a small MLP in float16 with dynamic loss scaling (synthetic data).",
    )
    parser.add_argument("--steps", type=int, default=300, help="training steps (default 300)")
    parser.add_argument(
        "--level", default="O2", choices=LEVELS, help="precision level (default O2)"
    )
    parser.add_argument(
        "--scale",
        default="auto",
        choices=("auto", "dynamic", "static", "none"),
        help="the scaler (default: what the level pairs with)",
    )
    parser.add_argument(
        "--inject",
        type=_int_list,
        default=[100, 101, 200],
        help="comma-separated steps with injected overflows (default 100,101,200; '' for none; steps past --steps are ignored)",
    )
    parser.add_argument("--out", default="jax_amp_scale_demo.png", help="PNG path for the plot")
    parser.add_argument("--no-plot", action="store_true", help="skip the PNG")
    parser.add_argument(
        "--no-baseline",
        action="store_true",
        help="do not train the float32 (O0) baseline (its loss in the summary, "
        "its line in the plot)",
    )
    parser.add_argument(
        "--growth-interval", type=int, default=50, help="dynamic scale growth interval"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json",
        metavar="PATH",
        help="also write the summary's figures to PATH as JSON "
        "(tools/figures.py records README's from it)",
    )
    parser.add_argument(
        "--quiet",
        action="store_true",
        help="no progress output (a bar on a terminal, lines otherwise); "
        "the summary is still printed",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    inject = [s for s in args.inject if s < args.steps]
    try:
        result = train(
            args.steps,
            args.level,
            args.scale,
            inject,
            seed=args.seed,
            growth_interval=args.growth_interval,
            progress=not args.quiet,
        )
    except ValueError as e:
        parser.error(str(e))
    baseline = None
    if args.level != "O0" and not args.no_baseline:
        if not args.quiet:
            print("training the float32 (O0) baseline ...", file=sys.stderr, flush=True)
        baseline = train(args.steps, "O0", "none", (), seed=args.seed)
    print(table := summary_table(result, level=args.level, scale=args.scale, baseline=baseline))
    if args.json:  # with the table as README shows it (tools/figures.py: demo.summary)
        with open(args.json, "w") as f:
            json.dump(
                {**summary_figures(result, baseline), "figures": {"summary": table}}, f, indent=1
            )
    title = f"{args.level} / scale {args.scale}, adam, {args.steps} steps"
    if not args.no_plot and plot(result, args.out, baseline=baseline, title=title):
        print(f"plot written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
