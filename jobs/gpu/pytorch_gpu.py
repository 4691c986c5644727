#!/usr/bin/python3
"""PyTorch's side of the GPU benchmark in jobs/gpu/check.sh (docs/gpu.md):
the UNet3D of a tessera config (the module of the golden test,
tests/golden/make_golden.py) trained on one GPU on random data, full
steps (forward, loss, backward, optimizer) after warm-up, in each mode:

  eager    channels_last_3d, bf16 autocast (torch.autocast("cuda", bfloat16))
  compile  the same through torch.compile (default mode)

for each batch size. FLOP per step: the convolutions' multiply-adds counted
by forward hooks (2 x output elements x input channels x kernel volume per
conv and transposed conv), times 3 for forward + both backward products
(an analytic count, the same rule as tessera's cost model). The peak is
the device's dense bf16 tensor-core rate given by --peak-tflops (989 for an
H100/H200 SXM). Prints one JSON object per line, then the best of each
batch size; exit 2 without a GPU.

usage: pytorch_gpu.py CONFIG.ini [--patch 128] [--batches 2,8]
                      [--modes eager,compile] [--steps 10] [--warmup 3]
                      [--peak-tflops 989]
"""
import argparse
import configparser
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden"))
from make_golden import UNet3D, loss_fn  # noqa: E402


def head(out):
    return out[0] if isinstance(out, (list, tuple)) else out


def conv_flops(m, x):
    """forward multiply-add FLOP of the convolutions for input x"""
    total = [0]

    def hook(mod, inp, out):
        k = 1
        for v in mod.kernel_size:
            k *= v
        if isinstance(mod, torch.nn.ConvTranspose3d):  # every input voxel meets every tap
            total[0] += 2 * inp[0].numel() * mod.out_channels * k
        else:
            total[0] += 2 * out.numel() * (mod.in_channels // mod.groups) * k

    hs = [c.register_forward_hook(hook) for c in m.modules()
          if isinstance(c, (torch.nn.Conv3d, torch.nn.ConvTranspose3d))]
    with torch.no_grad():
        m(x)
    for h in hs:
        h.remove()
    return total[0]


def run(cfg, patch, batch, mode, steps, warmup, peak):
    g = lambda s, k, d: cfg.get(s, k, fallback=d)
    channels = [int(v) for v in g("model", "channels", "16,32,64,128").split(",")]
    cin, classes = int(g("model", "in_channels", "1")), int(g("model", "classes", "2"))
    norm, groups = g("model", "norm", "batch"), int(g("model", "groups", "8"))
    torch.manual_seed(0)
    dev = torch.device("cuda")
    m = UNet3D(channels, cin, classes, norm, groups).to(dev).to(memory_format=torch.channels_last_3d)
    opt = torch.optim.SGD(m.parameters(), lr=float(g("train", "lr", "0.01")),
                          momentum=float(g("train", "momentum", "0.9")))
    x = torch.randn([batch, cin] + patch, device=dev).contiguous(memory_format=torch.channels_last_3d)
    y = torch.randint(0, classes, [batch] + patch, device=dev).to(torch.uint8)
    flop = 3 * conv_flops(m, x)
    case = {"loss": g("train", "loss", "ce")}
    fwd = torch.compile(m) if mode == "compile" else m

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = loss_fn(head(fwd(x)).float(), y, case)
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.perf_counter() - t0
    times = []
    for _ in range(steps):
        a = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - a)
    best = min(times)
    mean = sum(times) / len(times)
    r = {"impl": "pytorch " + torch.__version__, "mode": mode, "layout": "channels_last_3d", "precision": "bf16 autocast",
         "patch": patch, "batch": batch, "steps": steps, "warmup_s": round(warm_s, 2),
         "step_ms": mean * 1e3, "best_step_ms": best * 1e3, "samples_per_s": batch / mean,
         "flop_per_step": flop, "tflops": flop / mean / 1e12, "fraction_of_peak": flop / mean / 1e12 / peak,
         "peak_tflops": peak, "gpu": torch.cuda.get_device_name(0), "loss": loss.item(),
         "max_mem_gib": torch.cuda.max_memory_allocated() / 2**30}
    del m, opt, x, y, fwd
    torch.cuda.empty_cache()
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--patch", type=int, default=128)
    ap.add_argument("--batches", default="2,8")
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--peak-tflops", type=float, default=989.0)
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("pytorch_gpu.py: no GPU visible to PyTorch", file=sys.stderr)
        sys.exit(2)
    torch.backends.cudnn.benchmark = True
    cfg = configparser.ConfigParser()
    cfg.read(a.config)
    best = {}
    for b in [int(v) for v in a.batches.split(",")]:
        for mode in a.modes.split(","):
            try:
                r = run(cfg, [a.patch] * 3, b, mode, a.steps, a.warmup, a.peak_tflops)
            except Exception as e:  # one mode failing (compile) must not lose the others
                r = {"impl": "pytorch " + torch.__version__, "mode": mode, "batch": b, "error": repr(e)[:400]}
            print(json.dumps(r), flush=True)
            if "samples_per_s" in r and r["samples_per_s"] > best.get(b, {}).get("samples_per_s", 0):
                best[b] = r
    for b, r in best.items():
        print(json.dumps({"best_of_pytorch": True, "batch": b, "mode": r["mode"], "samples_per_s": r["samples_per_s"],
                          "tflops": r["tflops"], "fraction_of_peak": r["fraction_of_peak"]}), flush=True)


if __name__ == "__main__":
    main()
