"""Workload 5: torch's GradScaler step overhead on CPU, for scale.

`torch_steps` also serves workload 1's ``--torch``.
"""

from __future__ import annotations

from types import SimpleNamespace

import _harness


def torch_steps(width, depth, batch, compute, optimizer, device, fused=True) -> SimpleNamespace:
    """The MLP in torch on `device`, autocast to `compute`; its optimizer (fused where torch
    has it and `fused`: GradScaler then hands the unscale to the fused kernel), its
    GradScaler(init_scale=2**15), its plain and scaled steps (each synchronised)."""
    import torch

    torch.manual_seed(0)
    layers = []
    for i in range(depth):
        layers += [torch.nn.Linear(width, width)] + ([torch.nn.ReLU()] if i < depth - 1 else [])
    model = torch.nn.Sequential(*layers).to(device)
    x, y = torch.randn(batch, width).to(device), torch.randn(batch, width).to(device)
    kind = torch.optim.Adam if optimizer == "adam" else torch.optim.SGD
    kw = {"lr": 1e-3} if optimizer == "adam" else {"lr": 1e-3, "momentum": 0.9}
    try:
        opt = kind(model.parameters(), **kw, **({"fused": True} if fused else {}))
    except (RuntimeError, TypeError):  # no fused kernel for this device
        opt = kind(model.parameters(), **kw)
    scaler = torch.amp.GradScaler(device.type, init_scale=2.0**15)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def loss():
        with torch.autocast(device.type, dtype=torch.float16, enabled=compute == "float16"):
            out = model(x)
        return torch.mean(torch.square(out.float() - y))

    def plain():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()
        sync()

    def scaled():
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss()).backward()
        scaler.step(opt)
        scaler.update()
        sync()

    fused = bool(opt.defaults.get("fused"))
    return SimpleNamespace(
        model=model, opt=opt, scaler=scaler, loss=loss, fused=fused, plain=plain, scaled=scaled
    )


def step_candidates(width, depth, batch, compute, optimizer, device) -> dict:
    """torch's plain and GradScaler steps, for workload 1's table."""
    s = torch_steps(width, depth, batch, compute, optimizer, device)
    tag = f"({optimizer}, {'fused' if s.fused else 'not fused'})"
    return {f"torch plain step {tag}": s.plain, f"torch GradScaler step {tag}": s.scaled}


def main(argv: list[str] | None = None) -> list[_harness.Table]:
    args = _harness.parser(__doc__.splitlines()[0], reps=5, warmup=1).parse_args(argv)
    try:
        import torch
    except ImportError:
        print("torch is not installed (pip install -e '.[bench]'): workload 5 skipped")
        _harness.save(args, [], show=True)
        return []
    width, depth, batch = (32, 2, 8) if args.tiny else (1024, 4, 256)
    reps, warmup = (1, 1) if args.tiny else (args.reps, args.warmup)
    runs = {"reps": reps, "warmup": warmup}
    s = torch_steps(width, depth, batch, "float16", "sgd", torch.device("cpu"), fused=False)
    mparams = sum(p.numel() for p in s.model.parameters()) / 1e6
    w, base = "5. torch for scale", "torch plain step"
    cands = {base: s.plain, "torch GradScaler step": s.scaled}
    title = f"torch CPU MLP {mparams:.1f}M params, batch {batch}, float16 autocast"
    notes = [
        f"torch {torch.__version__}, {torch.get_num_threads()} threads; "
        "SGD(lr=1e-3, momentum=0.9); GradScaler(init_scale=2**15).",
        "torch's CPU float16 matmuls are slow (no fast fp16 GEMM on this CPU), "
        "so the full step hides the scaler: see the next table for its own cost.",
    ]
    step = _harness.timed_table(w, title, cands, baseline=base, notes=notes, **runs)
    # The scaler's own work, on gradients computed once.
    s.opt.zero_grad(set_to_none=True)
    s.scaler.scale(s.loss()).backward()
    grads = [q.grad.detach().clone() for q in s.model.parameters()]

    def set_grads():
        for q, g in zip(s.model.parameters(), grads, strict=True):
            q.grad.copy_(g)

    def scaler_update():
        set_grads()
        s.scaler.unscale_(s.opt)
        s.scaler.step(s.opt)
        s.scaler.update()

    cands = {"optimizer.step": lambda: (set_grads(), s.opt.step())}
    cands["GradScaler unscale_+step+update"] = scaler_update
    title = f"torch GradScaler's own work on fixed gradients ({mparams:.1f}M params)"
    notes = ["both rows first copy the saved gradients into .grad (same cost in each)."]
    runs["reps"] = max(reps, 3) * (1 if args.tiny else 4)
    update = _harness.timed_table(w, title, cands, baseline="optimizer.step", notes=notes, **runs)
    for t in (step, update):
        t.columns = _harness.overhead_ms(t.rows)
    _harness.save(args, [step, update], show=True)
    return [step, update]


if __name__ == "__main__":
    main()
