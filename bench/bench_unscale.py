"""Workload 2: one pass over the gradients (unscale, check for inf/NaN).

256 MiB of gradients over 1, 100 and 10,000 leaves, one donated jitted call,
against a copy (y = -x), the peers, torch's fused op, the jit dispatch floor,
the bandwidth limit and ours inside a program.  Each case runs in its own
process (--in-process: not): XLA:CPU's 10,000-leaf executables pile up.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time

import _harness
import _steps
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

WORKLOAD, SCALE = "2. One pass over the gradients", 2.0**15
TORCH = "torch fused (_amp_foreach_non_finite_check_and_unscale_)"
DISPATCH = "jit dispatch floor (donated leaves returned, no kernel)"
LIMIT = "memory-bandwidth limit (np.negative in place, 1 buffer)"
LIMIT_GPU = "memory-bandwidth limit (torch neg_ in place, 1 buffer: HBM)"
OURS = "ours unscale_and_check[auto]"
PASSES = 9
LOOP1, LOOPN = "ours[auto], loop of 1 pass", f"ours[auto], the same loop, {PASSES} passes"
IN_PROGRAM = f"ours[auto] inside a program: one pass (({PASSES}-pass - 1-pass loop) / {PASSES - 1})"
DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def magnitude(dtype) -> float:
    return 2.0**8 if dtype == np.float16 else SCALE


def host_grads(total_bytes: int, n_leaves: int, dtype=np.float32) -> list[np.ndarray]:
    n = total_bytes // np.dtype(dtype).itemsize
    flat = np.random.default_rng(0).standard_normal(n, dtype=np.float32) * magnitude(dtype)
    return np.array_split(flat.astype(dtype), n_leaves)  # the first leaves one longer


# ---- candidates: each f(grads, scale, *extra) -> (unscaled grads, found_inf)


def plain_copy(grads, scale):
    # y = -x: donation elides an identity
    return [-g for g in grads], jnp.asarray(False)


def dispatch_floor(grads, scale):
    return list(grads), jnp.asarray(False)


def ours(backend):
    import jax_amp_scale as jas

    return lambda grads, state: jas.unscale_and_check(grads, state, backend=backend)


def ours_loop(grads, states, n):
    """`n` passes, state `i % 2` on pass `i`; the flag is carried (dropped,
    XLA:CPU ran the calls one after another)."""
    import jax_amp_scale as jas

    def body(i, carry):
        state = jax.tree.map(lambda a, b: jnp.where(i % 2 == 0, a, b), *states)
        grads, now = jas.unscale_and_check(carry[0], state)
        return grads, carry[1] | now

    return jax.lax.fori_loop(0, n, body, (grads, jnp.asarray(False)))


def jmp_unscale_check(grads, loss_scale):
    import jmp

    grads = loss_scale.unscale(grads)
    return grads, jnp.logical_not(jmp.all_finite(grads))


def flax_pattern(grads, scale):
    # flax.training.dynamic_scale.DynamicScale.value_and_grad, after jax.grad.
    grads = jax.tree.map(lambda g: jnp.asarray(g, jnp.float32) / scale, grads)
    finite = jnp.array(True)
    for g in jax.tree.leaves(grads):
        finite &= jnp.all(jax.lax.is_finite(g))
    return grads, jnp.logical_not(finite)


def optax_pattern(grads, scale):
    # A hand unscale, then optax.apply_if_finite's own finiteness test.
    grads = jax.tree.map(lambda g: g * (1.0 / scale), grads)
    finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(grads)]))
    return grads, jnp.logical_not(finite)


def jax_candidates(ours_ok: bool, peers: bool):
    out = {"plain copy": (plain_copy, jnp.float32)}
    if ours_ok:
        import jax_amp_scale as jas

        def pair(s):
            return jas.init_scale_state(s), jas.init_scale_state(1.0 / s)

        out[OURS] = (ours("auto"), jas.init_scale_state)
        out[LOOP1] = (ours_loop, pair, jnp.int32(1))  # one jit: n is traced
        out[LOOPN] = (ours_loop, pair, jnp.int32(PASSES))
        if peers:
            out["ours unscale_and_check[reference]"] = (ours("reference"), jas.init_scale_state)
    out[DISPATCH] = (dispatch_floor, jnp.float32)
    if peers:
        import jmp

        loss_scale = lambda s: jmp.DynamicLossScale(jnp.float32(s))  # noqa: E731
        out["jmp unscale + all_finite"] = (jmp_unscale_check, loss_scale)
        out["flax DynamicScale pattern"] = (flax_pattern, jnp.float32)
        out["optax unscale + apply_if_finite check"] = (optax_pattern, jnp.float32)
    return out


def torch_candidates(host: list[np.ndarray], dtype, device):
    """torch's fused op, the factor alternating to keep values bounded (as
    ours does), and torch's own copy of the same tensors."""
    import torch

    if dtype == ml_dtypes.bfloat16:  # torch cannot take NumPy's bfloat16: its bits
        grads = [torch.from_numpy(g.view(np.int16).copy()).view(torch.bfloat16) for g in host]
    else:
        grads = [torch.from_numpy(g.copy()) for g in host]
    grads = [g.to(device) for g in grads]
    dst, found = [torch.empty_like(g) for g in grads], torch.zeros(1, device=device)
    invs = [torch.full((1,), f, device=device) for f in (1.0 / magnitude(dtype), magnitude(dtype))]
    box = [0]

    def run():
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, invs[box[0]])
        box[0] ^= 1
        if float(found) != 0.0:  # reading the flag waits for the kernels
            raise RuntimeError("torch reported an overflow on finite gradients")

    copy = lambda: (torch._foreach_copy_(dst, grads), float(dst[0][0]))  # noqa: E731
    return {TORCH: run, "torch _foreach_copy_": copy}


def bandwidth_candidate(total_bytes: int, threads: int, device):
    """One contiguous buffer negated in place: NumPy over `threads` threads
    on the CPU, one torch kernel on a GPU."""
    if jax.default_backend() != "cpu":
        import torch

        buf = torch.ones(total_bytes // 4, device=device)
        return lambda: (buf.neg_(), torch.cuda.synchronize(device))
    from concurrent.futures import ThreadPoolExecutor

    parts = np.array_split(np.ones(total_bytes // 4, np.float32), threads)
    pool = ThreadPoolExecutor(threads)
    return lambda: list(pool.map(lambda a: np.negative(a, out=a), parts))


def run_case(args, total_bytes, n_leaves, reps, warmup, dtype, first_call):
    """Rows on `n_leaves` leaves, and the skipped candidates.  Each owns a
    copy of the gradients, donated to every call; the next call takes the
    result back with the inverse scale.  `first_call`: name -> leaves -> s."""
    host = host_grads(total_bytes, n_leaves, dtype)
    grads = [jnp.asarray(g) for g in host]
    dname = np.dtype(dtype).name
    peers = not args.no_peers and dtype == np.float32
    cands, skipped, jitted = {}, [], {}
    jax_cands = jax_candidates(_steps.ours_available() is None, peers)
    # The reference and the peers: XLA:CPU compiles a kernel per leaf, and
    # their first call grows faster than a projection from 1 and 100 leaves
    # could tell (one ran past 20 minutes at 10,000 on the 2-core machine).
    per_leaf = {
        n for n in jax_cands if n.startswith(("ours unscale_and_check[ref", "jmp", "flax", "optax"))
    }
    for name, (fn, make_scale, *extra) in jax_cands.items():
        seen = first_call.setdefault(f"{name} {dname}", {})
        if name in per_leaf and n_leaves > args.per_leaf_up_to:
            skipped.append(name)
            continue
        f = jitted.setdefault(fn, jax.jit(fn, donate_argnums=0))
        scales = (make_scale(magnitude(dtype)), make_scale(1.0 / magnitude(dtype)))
        mine = [jnp.copy(g) for g in grads]
        t0 = time.perf_counter()
        out, found = jax.block_until_ready(f(mine, scales[0], *extra))
        seen[str(n_leaves)] = time.perf_counter() - t0
        if not all(g.is_deleted() for g in mine) or bool(found):
            raise RuntimeError(f"{name}: gradients not donated, or an overflow reported")
        box = [out, 1]

        def run(f=f, scales=scales, box=box, extra=extra):
            out, _ = f(box[0], scales[box[1]], *extra)
            box[0], box[1] = jax.block_until_ready(out), 1 - box[1]

        cands[name] = run
    device = None if args.no_torch else _harness.torch_device()
    if device is not None:
        cands |= torch_candidates(host, dtype, device)
    if jax.default_backend() == "cpu" or device is not None:
        cands[LIMIT if jax.default_backend() == "cpu" else LIMIT_GPU] = bandwidth_candidate(
            total_bytes, args.threads, device
        )
    rows = _harness.measure(cands, baseline="plain copy", reps=reps, warmup=warmup)
    names = [r.name for r in rows]
    if LOOP1 in names and LOOPN in names:  # the derived in-program row, paired
        one, many = rows[names.index(LOOP1)], rows[names.index(LOOPN)]
        times = [(c - a) / (PASSES - 1) for a, c in zip(one.times, many.times, strict=True)]
        ratios = [t / b for t, b in zip(times, rows[0].times, strict=True)]
        rows.insert(names.index(LOOPN) + 1, _harness.Row(IN_PROGRAM, times, ratios))
    for r in rows:
        if f"{r.name} {dname}" in first_call:
            r.extra["first_call_s"] = first_call[f"{r.name} {dname}"][str(n_leaves)]
    return rows, skipped


def columns(rows, total_bytes) -> dict[str, dict[str, str]]:
    """Throughput, the ratio to torch's fused op (paired) and the first call."""
    gib, base = total_bytes / 2**30, rows[0].median
    out = {
        "GiB/s (gradient bytes)": {r.name: f"{gib / r.median:.2f}" for r in rows},
        "% of copy throughput": {r.name: f"{100 * base / r.median:.0f}%" for r in rows},
    }
    if torch := next((r for r in rows if r.name == TORCH), None):
        out["ratio to torch fused"] = {
            r.name: f"{_harness.paired_ratio(r, torch):.2f}" for r in rows
        }
    out["first call, compile included (s)"] = {
        r.name: f"{r.extra['first_call_s']:.2f}" for r in rows if "first_call_s" in r.extra
    }
    return out


def main(argv: list[str] | None = None) -> list[_harness.Table]:
    p = _harness.parser(__doc__.splitlines()[0], reps=10)
    p.add_argument("--no-torch", action="store_true", help="skip torch's rows and tables")
    p.add_argument("--dtypes", nargs="+", default=["float32", "float16"], choices=list(DTYPES))
    p.add_argument("--no-peers", action="store_true", help="only ours, copy, torch, floors")
    p.add_argument("--leaves", type=int, nargs="+", help="leaf counts (default 1 100 10000)")
    p.add_argument("--mib", type=int, default=256, help="gradient bytes in MiB (default 256)")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1, help="of the CPU limit")
    p.add_argument(
        "--per-leaf-up-to",
        type=int,
        default=100,
        help="most leaves for the reference and the peers (a kernel per leaf; default 100)",
    )
    p.add_argument("--in-process", action="store_true", help="every case in this process")
    args = p.parse_args(argv)
    if args.tiny:
        total, leaf_counts, reps, warmup = 1 << 16, (1, 10, 100), 1, 1
    else:
        total, leaf_counts, reps, warmup = args.mib << 20, (1, 100, 10_000), args.reps, args.warmup
    cases = [(d, n) for d in args.dtypes for n in args.leaves or leaf_counts]
    if not args.in_process and len(cases) > 1:  # each case: this command, for it alone
        tables = []
        with tempfile.TemporaryDirectory() as tmp:
            for k, (dname, n) in enumerate(cases):
                out = os.path.join(tmp, f"{k}.json")
                case = ["--in-process", "--dtypes", dname, "--leaves", str(n), "--json", out]
                cmd = [sys.executable, __file__, *(sys.argv[1:] if argv is None else argv), *case]
                subprocess.run(cmd, check=True, stdout=sys.stderr)
                with open(out) as f:
                    tables += [_harness.Table.from_json(t) for t in json.load(f)["tables"]]
                _harness.save(args, tables)
        _harness.save(args, tables, show=True)
        return tables
    first_call: dict[str, dict[str, float]] = {}
    tables = []
    for dname, n in cases:
        why = _steps.ours_available()
        notes = [] if why is None else [f"ours not measured: {why}"]
        if dname != "float32":
            notes.append(f"{dname}: the peers are not run (their float32 rows show the pattern).")
        limit = f"{LIMIT}: {args.threads} thread(s)"
        if jax.default_backend() != "cpu":
            limit = f"torch on {_harness.torch_device()}; {LIMIT_GPU}: one kernel"
        notes.append(
            f"{limit}; {DISPATCH}: jit's own cost for {n} donated "
            "arrays in and out, which every jitted candidate pays and torch does not."
        )
        rows, skipped = run_case(args, total, n, reps, warmup, DTYPES[dname], first_call)
        if skipped:
            notes.append(
                f"not run at {n:,} leaves (--per-leaf-up-to {args.per_leaf_up_to}): "
                + "; ".join(skipped)
                + ". XLA compiles one kernel per leaf reduction on the CPU, and their "
                "first call runs for many minutes there."
            )
        cols = columns(rows, total)
        title = f"{total >> 20} MiB {dname} over {n} leaves"
        t = _harness.Table(WORKLOAD, title, "plain copy", rows, "ms", reps, warmup, notes, cols)
        tables.append(t)
        _harness.save(args, tables)
    _harness.save(args, tables, show=True)
    return tables


if __name__ == "__main__":
    main()
