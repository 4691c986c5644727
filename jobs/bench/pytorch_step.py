#!/usr/bin/python3
"""One PyTorch (Debian python3-torch) measurement for jobs/bench/compare_pytorch.sh:
the UNet3D of a tessera config (the same module as the golden test,
tests/golden/make_golden.py: norm, leaky ReLU, deep supervision with
nnU-Net's weighted losses, SGD with Nesterov momentum or AdamW as the
config says), full training steps (forward, loss, backward,
optimizer) on random data, after warm-up. Prints one JSON object with
samples_per_s, voxels_per_s, step_ms and peak_rss_mb (ru_maxrss of this
process).

usage: pytorch_step.py CONFIG.ini [--threads T] [--steps N] [--warmup W]
                       [--layout ncdhw|channels_last] [--bf16]
--layout channels_last puts the model and the input in torch.channels_last_3d
(NDHWC, PyTorch's faster layout for 3D convolutions on CPUs with oneDNN);
--bf16 runs forward and loss under torch.autocast("cpu", torch.bfloat16), as
a PyTorch user would for tessera's train.precision = bf16.
"""
import argparse
import configparser
import json
import os
import resource
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden"))
from make_golden import UNet3D, ds_loss_fn  # noqa: E402


def outputs(out):
    """the logits of levels 0, 1, ... (the reference module returns a list
    of the full-resolution logits and the deep-supervision outputs)"""
    return list(out) if isinstance(out, (list, tuple)) else [out]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--layout", choices=["ncdhw", "channels_last"], default="ncdhw")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--batch", type=int, default=0, help="train.batch instead of the config's")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    c = configparser.ConfigParser()
    c.read(a.config)
    g = lambda s, k, d: c.get(s, k, fallback=d)
    channels = [int(x) for x in g("model", "channels", "16,32,64,128").split(",")]
    cin, classes = int(g("model", "in_channels", "1")), int(g("model", "classes", "2"))
    norm, groups = g("model", "norm", "batch"), int(g("model", "groups", "8"))
    patch = [int(x) for x in g("data", "patch", "64").split(",")]
    patch = patch * 3 if len(patch) == 1 else patch
    batch = a.batch or int(g("train", "batch", "2"))
    lr, momentum = float(g("train", "lr", "0.01")), float(g("train", "momentum", "0.9"))
    wd = float(g("train", "weight_decay", "0"))
    ds = g("model", "deep_supervision", "false") == "true"
    act, slope = g("model", "act", "relu"), float(g("model", "leaky_slope", "0.01"))
    nesterov = g("train", "nesterov", "false") == "true"
    case = {"loss": g("train", "loss", "ce"), "deep_supervision": ds, "channels": channels}
    torch.manual_seed(0)
    arch = g("model", "arch", "unet")
    blocks = [int(x) for x in g("model", "res_blocks", "1,3,4,6,6,6,6,6").split(",")][:len(channels)]
    m = UNet3D(channels, cin, classes, norm, groups, deep_supervision=ds, act=act, slope=slope, arch=arch,
               res_blocks=blocks if arch == "resenc" else None)

    def optimizer():
        if g("train", "optimizer", "sgd") == "sgd":
            return torch.optim.SGD(m.parameters(), lr=lr, momentum=momentum, weight_decay=wd, nesterov=nesterov)
        return torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=wd)

    opt = optimizer()
    x = torch.randn([batch, cin] + patch)
    y = torch.randint(0, classes, [batch] + patch).to(torch.uint8)
    if a.layout == "channels_last":
        m = m.to(memory_format=torch.channels_last_3d)
        x = x.contiguous(memory_format=torch.channels_last_3d)
        opt = optimizer()  # over the converted parameters
    times = []
    for s in range(a.warmup + a.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        if a.bf16:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = ds_loss_fn([o.float() for o in outputs(m(x))], y, case)
        else:
            loss = ds_loss_fn(outputs(m(x)), y, case)
        loss.backward()
        opt.step()
        if s >= a.warmup:
            times.append(time.perf_counter() - t0)
    step = sum(times) / len(times)
    vox = patch[0] * patch[1] * patch[2]
    print(json.dumps({"impl": "pytorch " + torch.__version__, "layout": a.layout, "bf16": a.bf16, "samples_per_s": batch / step,
                      "voxels_per_s": batch * vox / step, "step_ms": step * 1e3, "best_step_ms": min(times) * 1e3,
                      "threads": a.threads, "batch": batch, "patch": patch,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0,
                      "loss": loss.item()}))


if __name__ == "__main__":
    main()
