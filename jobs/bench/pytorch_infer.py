#!/usr/bin/python3
"""PyTorch's side of jobs/bench/compare_infer.sh: the sliding-window
prediction of one NIfTI scan with the UNet3D of a tessera config and the
parameters of a tessera checkpoint (its state.h5 holds them under
PyTorch's names, docs/formats-weights.md), done as `tessera infer` does it
with preprocess=none, downsample=1, no mirroring:

- the scan read with nibabel, as tessera's [D, H, W] = NIfTI (k, j, i);
- data.norm = image or foreground: z-score over the scan (foreground: the
  voxels above the scan's mean, as tessera convert and infer);
- windows of data.patch with eval.overlap placed as src/infer/window.c
  places them (evenly spaced, the last flush with the border, zero outside
  the volume), the model in eval mode (batch norm's running statistics);
- Gaussian weights (sigma = edge / 8, peak 1, floored at 1e-3) times the
  softmax, summed, argmax; the mask written as uint8 NIfTI with the scan's
  affine.

--windows N puts N windows in each forward (1 or 4 in the benchmark);
--layout channels_last runs the model and the input in
torch.channels_last_3d; --bf16 runs the forward under
torch.autocast("cpu", torch.bfloat16). Prints one JSON object: network_s
(the forwards, from the first window cut to the last softmax added),
predict_s (the whole sliding window), total_s (from the start of main:
reading, normalising, predicting, writing; the interpreter's and torch's
import come on top, which the caller's wall-clock time includes),
windows, forwards, peak_rss_mb.

usage: pytorch_infer.py CONFIG CHECKPOINT_STATE.h5 SCAN.nii.gz OUT.nii.gz
                        [--threads T] [--windows N] [--layout ncdhw|channels_last] [--bf16]
                        [--prob PROB.npy]
"""
import argparse
import configparser
import json
import math
import os
import resource
import sys
import time

import h5py
import nibabel as nib
import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "golden"))
from make_golden import UNet3D  # noqa: E402


def window_counts(vol, win, overlap):
    n = []
    for v, w in zip(vol, win):
        if v <= w:
            n.append(1)
        else:
            stride = max(1.0, w * (1 - overlap))
            n.append(int(math.ceil((v - w) / stride)) + 1)
    return n


def origins(vol, win, n):
    """src/infer/window.c's ts_window_origin, in the same order (W fastest)"""
    out = []
    for kz in range(n[0]):
        for ky in range(n[1]):
            for kx in range(n[2]):
                o = []
                for a, k in enumerate((kz, ky, kx)):
                    span = vol[a] - win[a]
                    o.append(0 if n[a] == 1 or span <= 0 else int(round_half_away(span * k / (n[a] - 1))))
                out.append(o)
    return out


def round_half_away(x):
    return math.floor(x + 0.5) if x >= 0 else -math.floor(-x + 0.5)


def gaussian(win):
    g = []
    for w in win:
        c, s = (w - 1) / 2.0, w / 8.0
        v = np.exp(-0.5 * (np.arange(w) - c) ** 2 / (s * s))
        g.append(v / v.max())
    w3 = g[0][:, None, None] * g[1][None, :, None] * g[2][None, None, :]
    return np.maximum(w3, 1e-3).astype(np.float32)


def main():
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("state")
    ap.add_argument("scan")
    ap.add_argument("out")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--windows", type=int, default=1)
    ap.add_argument("--layout", choices=["ncdhw", "channels_last"], default="ncdhw")
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--prob", help="also save the normalised probabilities [K, D, H, W] (numpy)")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    c = configparser.ConfigParser(inline_comment_prefixes=("#",))
    c.read(a.config)
    g = lambda s, k, d: c.get(s, k, fallback=d)
    channels = [int(x) for x in g("model", "channels", "16,32,64,128").split(",")]
    cin, classes = int(g("model", "in_channels", "1")), int(g("model", "classes", "2"))
    norm, groups = g("model", "norm", "batch"), int(g("model", "groups", "8"))
    ds = g("model", "deep_supervision", "false") == "true"
    act, slope = g("model", "act", "relu"), float(g("model", "leaky_slope", "0.01"))
    patch = [int(x) for x in g("data", "patch", "64").split(",")]
    patch = patch * 3 if len(patch) == 1 else patch
    overlap = float(g("eval", "overlap", "0.5"))
    dnorm = g("data", "norm", "image")
    if dnorm not in ("image", "foreground") or g("data", "clip", "none") not in ("none", ""):
        sys.exit(f"pytorch_infer.py: data.norm = {dnorm} (with data.clip) is not reproduced here; image or foreground only")
    if cin != 1:
        sys.exit("pytorch_infer.py: one input channel only")

    m = UNet3D(channels, cin, classes, norm, groups, deep_supervision=ds, act=act, slope=slope)
    with h5py.File(a.state, "r") as f:
        sd = {k: torch.from_numpy(np.array(v)) for k, v in f["params"].items()}
    m.load_state_dict(sd, strict=True)
    m.eval()
    if a.layout == "channels_last":
        m = m.to(memory_format=torch.channels_last_3d)

    img = nib.load(a.scan)
    x = np.asarray(img.dataobj, dtype=np.float32)
    if x.ndim == 4:
        x = x[..., 0]
    vol = np.ascontiguousarray(x.transpose(2, 1, 0))  # [D, H, W] = (k, j, i)
    mean = float(vol.mean(dtype=np.float64))
    std = float(vol.std(dtype=np.float64))
    if dnorm == "foreground":
        fg = vol[vol > mean].astype(np.float64)
        if fg.size:
            mean, std = float(fg.mean()), float(fg.std())
    if not std > 1e-8:
        std = 1.0
    vol = ((vol - np.float32(mean)) * np.float32(1.0 / std)).astype(np.float32)

    t_pred = time.perf_counter()
    D, H, W = vol.shape
    n = window_counts(vol.shape, patch, overlap)
    org = origins(vol.shape, patch, n)
    wt = torch.from_numpy(gaussian(patch))
    acc = torch.zeros([classes, D, H, W])
    wsum = torch.zeros([D, H, W])
    src = torch.from_numpy(vol)
    forwards = 0
    t_net = time.perf_counter()
    with torch.no_grad():
        for b in range(0, len(org), a.windows):
            chunk = org[b:b + a.windows]
            xb = torch.zeros([a.windows, 1] + patch)  # zero outside the volume, as tessera
            for i, (z, y, xo) in enumerate(chunk):
                sz = src[z:z + patch[0], y:y + patch[1], xo:xo + patch[2]]
                xb[i, 0, :sz.shape[0], :sz.shape[1], :sz.shape[2]] = sz
            if a.layout == "channels_last":
                xb = xb.contiguous(memory_format=torch.channels_last_3d)
            if a.bf16:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    out = m(xb)
            else:
                out = m(xb)
            logits = (out[0] if isinstance(out, (list, tuple)) else out).float()
            prob = torch.softmax(logits, dim=1)
            forwards += 1
            for i, (z, y, xo) in enumerate(chunk):
                dz, dy, dx = min(patch[0], D - z), min(patch[1], H - y), min(patch[2], W - xo)
                w = wt[:dz, :dy, :dx]
                acc[:, z:z + dz, y:y + dy, xo:xo + dx] += prob[i, :, :dz, :dy, :dx] * w
                wsum[z:z + dz, y:y + dy, xo:xo + dx] += w
    t_net_end = time.perf_counter()
    pred = acc.argmax(dim=0).to(torch.uint8).numpy()
    t_pred_end = time.perf_counter()
    if a.prob:
        np.save(a.prob, (acc / wsum).numpy())
    out = nib.Nifti1Image(np.ascontiguousarray(pred.transpose(2, 1, 0)), img.affine)
    out.set_data_dtype(np.uint8)
    nib.save(out, a.out)
    t_end = time.perf_counter()
    print(json.dumps({"impl": "pytorch " + torch.__version__, "layout": a.layout, "bf16": a.bf16,
                      "windows_per_forward": a.windows, "threads": a.threads, "windows": len(org),
                      "forwards": forwards, "grid": [D, H, W], "network_s": t_net_end - t_net,
                      "predict_s": t_pred_end - t_pred, "total_s": t_end - t_start,
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0}))


if __name__ == "__main__":
    main()
