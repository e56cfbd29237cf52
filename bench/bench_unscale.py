"""Workload 2: one pass over the gradients (unscale and check for inf/NaN).

256 MiB of float32 (and float16, bfloat16: --dtypes) gradients split over
1, 100 and 10,000 leaves.  Each candidate is one jitted call that reads
every gradient, writes the unscaled gradients in place (the gradients are
donated) and returns whether any is non-finite.  The baseline is a plain copy of the same
bytes, ``y = -x`` in place (read 256 MiB, write 256 MiB); the peers do the
same work with their own functions (jmp) or their documented pattern written
out (flax, optax: neither exports an unscale-and-check on a given tree).

Side by side in the same table, interleaved (on a GPU, torch and the limit
run on the GPU JAX runs on):

* torch's fused in-place ``_amp_foreach_non_finite_check_and_unscale_``
  (what GradScaler calls) on its own copy of the same gradients;
* "jit dispatch floor": a jitted function that donates the same leaves and
  returns them untouched (no kernel runs): what any jitted call over this
  many arrays costs before it does any work;
* "memory-bandwidth limit": NumPy's in-place ``np.negative(x, out=x)`` over
  one contiguous buffer of the same bytes, split over --threads threads (one
  read and one write of every byte, no per-array overhead); on a GPU, torch's
  in-place ``neg_`` of one buffer (one kernel: the HBM limit as measured);
* ours inside a program: one compiled loop that runs the pass `n` times
  (the scale and its inverse in turn; `n` is an argument, so one executable),
  called with n=3 and n=1; half the difference, paired per repetition, is
  what one pass costs inside a compiled step, where the gradients are not
  jit arguments and jit's per-array cost (the floor above) is not paid.

The float16 table runs ours, the copy, torch and the floors only (the
peers' float32 rows show their pattern).  Each leaf count and dtype runs in
a process of its own (``--in-process`` runs them all in this one): in one
process, what XLA:CPU keeps of the 10,000-leaf executables piled up past
22 GB and the run was killed on a 23 GB machine.

    python bench/bench_unscale.py            # full size
    python bench/bench_unscale.py --tiny     # smoke
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness

SCALE = 2.0**15
# Compile time grows faster than the tree where a candidate compiles kernels
# per leaf (workload 3 measures exponents of 1.2-1.4 on XLA:CPU): a linear
# projection let three peers' 10,000-leaf compiles (0.4 s at 100 leaves,
# projected 39 s) start, run for over 15 minutes and take 21 GB.
GROWTH = 1.25
TORCH = "torch fused (_amp_foreach_non_finite_check_and_unscale_)"
DISPATCH = "jit dispatch floor (donated leaves returned, no kernel)"
LIMIT = "memory-bandwidth limit (np.negative in place, 1 buffer)"
LIMIT_GPU = "memory-bandwidth limit (torch neg_ in place, 1 buffer: HBM)"
OURS = "ours unscale_and_check[auto]"
LOOP1 = "ours[auto], loop of 1 pass"
# The long loop's passes: the in-program estimate is (long - 1-pass) / (PASSES - 1),
# so jit's per-call cost (87 ms at 10,000 leaves, +-30 ms on this VM) cancels
# and its noise is divided by PASSES - 1 (with 3 passes, by 2: a 10,000-leaf
# estimate ranged from -116 to 173 ms).  Odd, so the loop unscales once.
PASSES = 9
LOOPN = f"ours[auto], the same loop, {PASSES} passes"
IN_PROGRAM = f"ours[auto] inside a program: one pass (({PASSES}-pass - 1-pass loop) / {PASSES - 1})"


DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def magnitude(dtype) -> float:
    """A typical scaled-gradient magnitude that stays finite in `dtype`."""
    return 2.0**8 if dtype == np.float16 else SCALE


def split_sizes(total: int, n: int) -> list[int]:
    """`n` leaf sizes adding up to `total`, differing by at most one."""
    q, r = divmod(total, n)
    return [q + 1] * r + [q] * (n - r)


def make_grads(total_bytes: int, n_leaves: int, dtype=np.float32) -> list[jax.Array]:
    sizes = split_sizes(total_bytes // np.dtype(dtype).itemsize, n_leaves)
    rng = np.random.default_rng(0)
    # Finite values of a typical scaled-gradient magnitude; one host array,
    # sliced, so building 10,000 leaves stays cheap.
    flat = (rng.standard_normal(sum(sizes), dtype=np.float32) * magnitude(dtype)).astype(dtype)
    out, at = [], 0
    for s in sizes:
        out.append(jnp.asarray(flat[at : at + s]))
        at += s
    return out


# ---- candidates: each f(grads, scale) -> (unscaled grads, found_inf) -------


def plain_copy(grads, scale):
    # Read N bytes, write N bytes, nothing else: y = -x (an identity would be
    # elided under donation, and a fresh-buffer copy measures the allocator).
    return [-g for g in grads], jnp.asarray(False)


def dispatch_floor(grads, scale):
    # No kernel: the donated buffers come straight back.  What jit costs for
    # this many array arguments and results before any work.
    return list(grads), jnp.asarray(False)


def ours(backend):
    import jax_amp_scale as jas

    def unscale_and_check(grads, state):
        return jas.unscale_and_check(grads, state, backend=backend)

    return unscale_and_check


def ours_loop(backend):
    """`n` passes in a `lax.fori_loop`, state `i % 2` on pass `i` (odd `n`:
    the call unscales once, as the one-pass candidate does).

    The overflow flag is carried, as a training step uses it.  Dropped, the
    per-call flags (dead values) shared one buffer and XLA:CPU ran the calls
    one after another: at 10,000 float16 leaves 22 ms a pass against
    16.5 ms with the flag carried."""
    import jax_amp_scale as jas

    def loop(grads, states, n):
        def body(i, carry):
            grads, found = carry
            state = jax.tree.map(lambda a, b: jnp.where(i % 2 == 0, a, b), *states)
            grads, now = jas.unscale_and_check(grads, state, backend=backend)
            return grads, found | now

        return jax.lax.fori_loop(0, n, body, (grads, jnp.asarray(False)))

    return loop


def in_program_row(rows):
    """The derived row: (PASSES-pass loop - 1-pass loop) / (PASSES - 1), per
    repetition (both ran in the same repetition, so load drift cancels)."""
    by_name = {r.name: r for r in rows}
    if LOOP1 not in by_name or LOOPN not in by_name:
        return rows
    one, many = by_name[LOOP1], by_name[LOOPN]
    base = rows[0]
    times = [(c - a) / (PASSES - 1) for a, c in zip(one.times, many.times, strict=True)]
    ratios = [t / b for t, b in zip(times, base.times, strict=True)]
    at = rows.index(many) + 1
    return [*rows[:at], _harness.Row(IN_PROGRAM, times, ratios), *rows[at:]]


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
    inv = 1.0 / scale
    grads = jax.tree.map(lambda g: g * inv, grads)
    finite = jnp.all(jnp.array([jnp.all(jnp.isfinite(p)) for p in jax.tree.leaves(grads)]))
    return grads, jnp.logical_not(finite)


def jax_candidates(ours_ok: bool, peers: bool = True):
    """name -> (function, scale -> the scale argument it takes, *more arguments)."""
    import jmp

    out = {"plain copy": (plain_copy, jnp.float32)}
    if ours_ok:
        import jax_amp_scale as jas

        # auto first: on one CPU device it is the fused native pass.
        out[OURS] = (ours("auto"), jas.init_scale_state)
        # One function object for both: one jit, one executable; n is traced.
        loop = ours_loop("auto")

        def pair(s):
            return jas.init_scale_state(s), jas.init_scale_state(1.0 / s)

        out[LOOP1] = (loop, pair, jnp.int32(1))
        out[LOOPN] = (loop, pair, jnp.int32(PASSES))
        if peers:
            out["ours unscale_and_check[reference]"] = (ours("reference"), jas.init_scale_state)
    out[DISPATCH] = (dispatch_floor, jnp.float32)
    if not peers:
        return out
    out["jmp unscale + all_finite"] = (
        jmp_unscale_check,
        lambda s: jmp.DynamicLossScale(jnp.float32(s)),
    )
    out["flax DynamicScale pattern"] = (flax_pattern, jnp.float32)
    out["optax unscale + apply_if_finite check"] = (optax_pattern, jnp.float32)
    return out


def torch_fused_candidate(total_bytes: int, n_leaves: int, dtype, device):
    """torch's fused in-place op on its own copy of the gradients on `device`."""
    import torch

    host = make_grads(total_bytes, n_leaves, dtype)
    if dtype == ml_dtypes.bfloat16:  # torch cannot take NumPy's bfloat16: its bits
        grads = [torch.from_numpy(np.array(g).view(np.int16)).view(torch.bfloat16) for g in host]
    else:
        grads = [torch.from_numpy(np.array(g)) for g in host]
    grads = [g.to(device, copy=True) for g in grads]
    found = torch.zeros(1, device=device)
    mag = magnitude(dtype)
    invs = [torch.full((1,), 1.0 / mag, device=device), torch.full((1,), mag, device=device)]
    box = [0]

    def run():
        # Alternate the factor so values stay bounded, as ours does.
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, invs[box[0]])
        box[0] ^= 1
        if float(found) != 0.0:  # reading the flag waits for the kernels
            raise RuntimeError("torch reported an overflow on finite gradients")

    return run


def bandwidth_candidate(total_bytes: int, threads: int):
    """In-place negation of one contiguous buffer, over `threads` threads.

    NumPy's ufunc loop releases the GIL and is vectorised: one read and one
    write of every byte, the most any in-place pass can move here.
    """
    from concurrent.futures import ThreadPoolExecutor

    buf = np.ones(total_bytes // 4, np.float32)
    parts = np.array_split(buf, threads)
    pool = ThreadPoolExecutor(threads)

    def run():
        list(pool.map(lambda a: np.negative(a, out=a), parts))

    return run


def device_bandwidth_candidate(total_bytes: int, device):
    """In-place negation of one contiguous torch buffer on the GPU: one read
    and one write of every byte in one kernel, what the device's memory
    moves at best (its HBM limit as measured, not as specified)."""
    import torch

    buf = torch.ones(total_bytes // 4, device=device)

    def run():
        buf.neg_()
        torch.cuda.synchronize(device)

    return run


def run_case(
    total_bytes: int,
    n_leaves: int,
    reps: int,
    warmup: int,
    ours_ok: bool,
    first_call: dict[str, dict[int, float]],
    budget_s: float,
    dtype=np.float32,
    threads: int = 2,
    peers: bool = True,
    torch_ok: bool = True,
):
    """Times every candidate on `n_leaves` leaves; returns (rows, skipped notes).

    Every candidate owns a copy of the gradients and donates it to each call
    (``donate_argnums``), so XLA writes the result in place, as it does with
    the gradients inside a training step and as torch's fused op does; the
    next call takes the result back with the inverse scale, so values stay
    the same magnitude.  `first_call` (name -> leaves -> seconds of the
    first, compiling call) is filled in; above 100 leaves a candidate whose
    first call, projected with exponent `GROWTH` from the largest size run so
    far, would pass `budget_s` is skipped (the copy baseline always runs).
    """
    grads = make_grads(total_bytes, n_leaves, dtype)
    cands, skipped = {}, []
    peers = peers and dtype == np.float32
    jitted = {}
    for name, (fn, make_scale, *extra) in jax_candidates(ours_ok, peers).items():
        seen = first_call.setdefault(f"{name} {np.dtype(dtype).name}", {})
        if seen and name != "plain copy" and n_leaves > 100:
            last = max(seen)
            proj = seen[last] * (n_leaves / last) ** GROWTH
            if proj > budget_s:
                skipped.append(f"{name} (first call projected {proj:.0f} s)")
                continue
        if fn not in jitted:
            jitted[fn] = jax.jit(fn, donate_argnums=0)
        f = jitted[fn]
        mag = magnitude(dtype)
        scales = (make_scale(mag), make_scale(1.0 / mag))
        mine = [jnp.copy(g) for g in grads]
        t0 = time.perf_counter()
        out, found = jax.block_until_ready(f(mine, scales[0], *extra))
        seen[n_leaves] = time.perf_counter() - t0
        if not all(g.is_deleted() for g in mine):
            raise RuntimeError(f"{name}: the gradients were not donated")
        if bool(found):
            raise RuntimeError(f"{name} reported an overflow on finite gradients")
        box = [out, 1]

        def run(f=f, scales=scales, box=box, extra=extra):
            out, _ = f(box[0], scales[box[1]], *extra)
            box[0], box[1] = jax.block_until_ready(out), 1 - box[1]

        cands[name] = run
    # torch and the bandwidth limit run where JAX runs: the host's threads
    # on the CPU, one torch kernel on the GPU.
    device = _harness.torch_device() if torch_ok else None
    if device is not None:
        cands[TORCH] = torch_fused_candidate(total_bytes, n_leaves, dtype, device)
    if jax.default_backend() == "cpu":
        cands[LIMIT] = bandwidth_candidate(total_bytes, threads)
    elif device is not None:
        cands[LIMIT_GPU] = device_bandwidth_candidate(total_bytes, device)
    rows = _harness.measure(cands, baseline="plain copy", reps=reps, warmup=warmup)
    rows = in_program_row(rows)
    for r in rows:
        key = f"{r.name} {np.dtype(dtype).name}"
        if key in first_call:
            r.extra["first_call_s"] = first_call[key][n_leaves]
    return rows, skipped


def vs_torch(rows) -> dict[str, str]:
    """Each row's median time over torch's fused op's (paired per repetition)."""
    base = next((r for r in rows if r.name == TORCH), None)
    if base is None:
        return {}
    return {r.name: f"{_harness.paired_ratio(r, base):.2f}" for r in rows}


def run_torch_case(total_bytes: int, n_leaves: int, reps: int, warmup: int):
    """torch's fused unscale-and-check (in place) against torch's copy."""
    import torch

    sizes = split_sizes(total_bytes // 4, n_leaves)
    flat = torch.randn(sum(sizes)) * SCALE
    grads = list(torch.split(flat, sizes))
    grads = [g.clone() for g in grads]  # separate allocations, as real grads
    dst = [torch.empty_like(g) for g in grads]
    found = torch.zeros(1)
    inv = torch.full((1,), 1.0 / SCALE)
    one = torch.ones(1)

    def copy():
        torch._foreach_copy_(dst, grads)

    def fused():
        # Unscales in place; multiplying back by the scale afterwards would
        # double the work, so alternate the factor to keep values bounded.
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
        torch._amp_foreach_non_finite_check_and_unscale_(grads, found, one / inv)

    rows = _harness.measure(
        {"torch _foreach_copy_": copy, "torch GradScaler fused unscale+check (x2)": fused},
        baseline="torch _foreach_copy_",
        reps=reps,
        warmup=warmup,
    )
    # `fused` ran the fused op twice per sample: report one call.
    rows[1].times = [t / 2 for t in rows[1].times]
    rows[1].ratios = [r / 2 for r in rows[1].ratios or []]
    rows[1].name = "torch fused unscale+check (_amp_foreach_non_finite_check_and_unscale_)"
    if float(found) != 0.0:
        raise RuntimeError("torch reported an overflow on finite gradients")
    return rows


def _throughput(rows, total_bytes):
    gib = total_bytes / 2**30
    base = rows[0].median
    thr = {r.name: f"{gib / r.median:.2f}" for r in rows}
    pct = {r.name: f"{100 * base / r.median:.0f}%" for r in rows}
    return {"GiB/s (gradient bytes)": thr, "% of copy throughput": pct}


def main(argv: list[str] | None = None) -> list[_harness.Table]:
    p = _harness.parser(__doc__.splitlines()[0], reps=10)
    p.add_argument("--no-torch", action="store_true", help="skip torch's rows and tables")
    p.add_argument(
        "--dtypes",
        nargs="+",
        default=["float32", "float16"],
        choices=list(DTYPES),
        help="gradient dtypes (default float32 float16; bfloat16 also)",
    )
    p.add_argument(
        "--no-peers", action="store_true", help="only ours, the copy, torch and the floors"
    )
    p.add_argument("--leaves", type=int, nargs="+", default=None, help="leaf counts")
    p.add_argument("--mib", type=int, default=256, help="gradient bytes in MiB (default 256)")
    p.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="threads of the memory-bandwidth candidate (default: all cores)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=90.0,
        help="skip a candidate whose first (compiling) call is projected past this "
        "many seconds at a larger leaf count (default 90)",
    )
    p.add_argument(
        "--in-process",
        action="store_true",
        help="run every case in this process (default: one process per leaf count and dtype)",
    )
    p.add_argument(
        "--first-call",
        metavar="PATH",
        help="JSON of the first calls' seconds so far, read and updated (the budget's "
        "projection across the per-case processes)",
    )
    args = p.parse_args(argv)
    if args.tiny:
        total, leaf_counts, reps, warmup = 1 << 16, (1, 10, 100), 1, 1
    else:
        total, leaf_counts, reps, warmup = args.mib << 20, (1, 100, 10_000), args.reps, args.warmup
    leaf_counts = tuple(args.leaves or leaf_counts)

    from _steps import ours_available

    why = ours_available()
    torch_ok = not args.no_torch
    try:
        import torch  # noqa: F401
    except ImportError:
        torch_ok = False

    cases = [(d, n) for d in args.dtypes for n in leaf_counts]
    if not args.in_process and len(cases) > 1:
        tables = run_cases_apart(args, cases)
        _harness.finish(args, tables)
        return tables
    tables = []
    first_call: dict[str, dict[int, float]] = {}
    if args.first_call and os.path.exists(args.first_call):
        with open(args.first_call) as f:
            first_call = {k: {int(n): t for n, t in v.items()} for k, v in json.load(f).items()}
    for dname, n in cases:
        dtype = DTYPES[dname]
        notes = [] if why is None else [f"ours not measured: {why}"]
        if dtype != np.float32:
            notes.append(f"{dname}: the peers are not run (their float32 rows show the pattern).")
        limit = f"{LIMIT}: {args.threads} thread(s)"
        if jax.default_backend() != "cpu":
            limit = f"torch on {_harness.torch_device()}; {LIMIT_GPU}: one kernel"
        notes.append(
            f"{limit}; {DISPATCH}: jit's own cost for {n} donated "
            "arrays in and out, which every jitted candidate pays and torch does not."
        )
        rows, skipped = run_case(
            total,
            n,
            reps,
            warmup,
            why is None,
            first_call,
            args.budget_s,
            dtype,
            args.threads,
            not args.no_peers,
            torch_ok,
        )
        if skipped:
            notes.append(
                f"not run at {n} leaves (--budget-s {args.budget_s:g}): "
                + "; ".join(skipped)
                + ". XLA compiles one kernel per leaf reduction on the CPU."
            )
        columns = _throughput(rows, total)
        columns["ratio to torch fused"] = vs_torch(rows)
        columns["first call, compile included (s)"] = {
            r.name: f"{r.extra['first_call_s']:.2f}" for r in rows if "first_call_s" in r.extra
        }
        tables.append(
            _harness.Table(
                workload="2. One pass over the gradients",
                title=f"{total >> 20} MiB {dname} over {n} leaves",
                baseline="plain copy",
                rows=rows,
                unit="ms",
                reps=reps,
                warmup=warmup,
                notes=notes,
                columns=columns,
            )
        )
        if torch_ok and dtype == np.float32 and jax.default_backend() == "cpu":
            rows = run_torch_case(total, n, reps, warmup)
            tables.append(
                _harness.Table(
                    workload="2. One pass over the gradients (torch reference)",
                    title=f"{total >> 20} MiB float32 over {n} tensors, torch CPU, in place",
                    baseline="torch _foreach_copy_",
                    rows=rows,
                    unit="ms",
                    reps=reps,
                    warmup=warmup,
                    columns=_throughput(rows, total),
                )
            )
        _harness.save(args, tables)
    if args.first_call:
        with open(args.first_call, "w") as f:
            json.dump(first_call, f)
    _harness.finish(args, tables)
    return tables


def run_cases_apart(args, cases: list[tuple[str, int]]) -> list[_harness.Table]:
    """Runs each (dtype, leaf count) case in a fresh process; their tables in order."""
    tables: list[_harness.Table] = []
    with tempfile.TemporaryDirectory() as tmp:
        first_call = os.path.join(tmp, "first_call.json")
        for k, (dname, n) in enumerate(cases):
            out = os.path.join(tmp, f"case{k}.json")
            cmd = [sys.executable, __file__, "--in-process", "--dtypes", dname]
            cmd += ["--leaves", str(n), "--json", out, "--first-call", first_call]
            cmd += ["--reps", str(args.reps), "--warmup", str(args.warmup)]
            cmd += ["--mib", str(args.mib), "--threads", str(args.threads)]
            cmd += ["--budget-s", str(args.budget_s)]
            cmd += [
                flag
                for flag, on in [
                    ("--tiny", args.tiny),
                    ("--no-torch", args.no_torch),
                    ("--no-peers", args.no_peers),
                ]
                if on
            ]
            # The child's own report goes to stderr; this process prints all
            # the tables together at the end.
            subprocess.run(cmd, check=True, stdout=sys.stderr)
            with open(out) as f:
                tables += [_harness.Table.from_json(t) for t in json.load(f)["tables"]]
    return tables


if __name__ == "__main__":
    main()
