"""Workload 5: torch's GradScaler step overhead on CPU, for scale.

The same MLP as workload 1 (4 dense layers 1024x1024 with biases, batch 256,
float32 weights, float16 autocast compute, SGD with momentum), in torch:
a plain step against the step with ``torch.amp.GradScaler("cpu")``.  A
second table isolates the scaler's own work on fixed gradients
(``unscale_`` + ``step`` + ``update`` against a plain ``optimizer.step``),
which the full step's matmuls otherwise drown.  torch is optional (the
``bench`` extra); without it this script says so and exits 0.

    python bench/bench_torch.py            # full size
    python bench/bench_torch.py --tiny     # smoke
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _harness


def build(width: int, depth: int, batch: int):
    import torch

    torch.manual_seed(0)
    layers = []
    for i in range(depth):
        layers.append(torch.nn.Linear(width, width))
        if i < depth - 1:
            layers.append(torch.nn.ReLU())
    model = torch.nn.Sequential(*layers)
    x = torch.randn(batch, width)
    y = torch.randn(batch, width)
    return model, x, y


def step_candidates(
    width: int, depth: int, batch: int, compute: str, optimizer: str, device
) -> dict[str, _harness.Candidate]:
    """torch's plain step and its GradScaler step on `device`, for workload 1's
    table: the same MLP, autocast to `compute`, the optimizer fused where
    torch has it (GradScaler then hands the unscale to the fused kernel)."""
    import torch

    model, x, y = build(width, depth, batch)
    model, x, y = model.to(device), x.to(device), y.to(device)
    half = compute == "float16"

    def make_opt():
        kind = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
        kw = {"lr": 1e-3} if optimizer == "adam" else {"lr": 1e-3, "momentum": 0.9}
        try:
            return kind(model.parameters(), fused=True, **kw)
        except (RuntimeError, TypeError):  # no fused kernel for this device
            return kind(model.parameters(), **kw)

    opt = make_opt()
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**15)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def loss_fn():
        with torch.autocast(device.type, dtype=torch.float16, enabled=half):
            out = model(x)
        return torch.mean(torch.square(out.float() - y))

    def plain():
        opt.zero_grad(set_to_none=True)
        loss_fn().backward()
        opt.step()
        sync()

    def scaled():
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss_fn()).backward()
        scaler.step(opt)
        scaler.update()
        sync()

    fused = "fused" if opt.defaults.get("fused") else "not fused"
    return {
        f"torch plain step ({optimizer}, {fused})": plain,
        f"torch GradScaler step ({optimizer}, {fused})": scaled,
    }


def main(argv: list[str] | None = None) -> list[_harness.Table]:
    p = _harness.parser(__doc__.splitlines()[0], reps=5, warmup=1)
    args = p.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("torch is not installed (pip install -e '.[bench]'): workload 5 skipped")
        _harness.finish(args, [])
        return []

    width, depth, batch = (32, 2, 8) if args.tiny else (1024, 4, 256)
    reps, warmup = (1, 1) if args.tiny else (args.reps, args.warmup)
    model, x, y = build(width, depth, batch)
    n_params = sum(p.numel() for p in model.parameters())

    def loss_fn():
        with torch.autocast("cpu", dtype=torch.float16):
            out = model(x)
        return torch.mean(torch.square(out.float() - y))

    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**15)

    def plain():
        opt.zero_grad(set_to_none=True)
        loss_fn().backward()
        opt.step()

    def scaled():
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss_fn()).backward()
        scaler.step(opt)
        scaler.update()

    rows = _harness.measure(
        {"torch plain step": plain, "torch GradScaler step": scaled},
        baseline="torch plain step",
        reps=reps,
        warmup=warmup,
    )
    base = rows[0].median
    step_table = _harness.Table(
        workload="5. torch for scale",
        title=f"torch CPU MLP {n_params / 1e6:.1f}M params, batch {batch}, float16 autocast",
        baseline="torch plain step",
        rows=rows,
        unit="ms",
        reps=reps,
        warmup=warmup,
        notes=[
            f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
            "SGD(lr=1e-3, momentum=0.9); GradScaler(init_scale=2**15).",
            "torch's CPU float16 matmuls are slow (no fast fp16 GEMM on this CPU), "
            "so the full step hides the scaler: see the next table for its own cost.",
        ],
        columns={"overhead (ms)": {r.name: f"{(r.median - base) * 1e3:+.1f}" for r in rows}},
    )

    # The scaler's own work, on gradients computed once.
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss_fn()).backward()
    grads = [q.grad.detach().clone() for q in model.parameters()]

    def set_grads():
        for q, g in zip(model.parameters(), grads, strict=True):
            q.grad.copy_(g)

    def plain_update():
        set_grads()
        opt.step()

    def scaler_update():
        set_grads()
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()

    urows = _harness.measure(
        {"optimizer.step": plain_update, "GradScaler unscale_+step+update": scaler_update},
        baseline="optimizer.step",
        reps=max(reps, 3) * (1 if args.tiny else 4),
        warmup=warmup,
    )
    ubase = urows[0].median
    update_table = _harness.Table(
        workload="5. torch for scale",
        title=f"torch GradScaler's own work on fixed gradients ({n_params / 1e6:.1f}M params)",
        baseline="optimizer.step",
        rows=urows,
        unit="ms",
        reps=max(reps, 3) * (1 if args.tiny else 4),
        warmup=warmup,
        notes=["both rows first copy the saved gradients into .grad (same cost in each)."],
        columns={"overhead (ms)": {r.name: f"{(r.median - ubase) * 1e3:+.2f}" for r in urows}},
    )
    tables = [step_table, update_table]
    _harness.finish(args, tables)
    return tables


if __name__ == "__main__":
    main()
