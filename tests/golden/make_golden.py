#!/usr/bin/python3
"""Generates the golden files of tests/golden with PyTorch (Debian's
python3-torch 1.13, python3-h5py): for each case a config (<case>.ini), the
initial weights (<case>-weights.h5, PyTorch's default initialisation) and
the expected results (<case>-expect.h5: /logits, /loss, and for train cases
/grads/<name> and /params/<name> after one optimizer step), computed in
float64 from the float32 weights and inputs (stored as float32, the loss as
float64). The inputs are input.h5 and
input-ignore.h5 (labels with the ignore value 255). `make check` compares
`tessera model run` on these files with the expected results
(tests/model/golden.sh); it never runs this script.

Run from anywhere:  /usr/bin/python3 tests/golden/make_golden.py
"""
import os
import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


class Block(nn.Module):
    def __init__(self, cin, cout, norm, groups, eps, momentum):
        super().__init__()
        for i, ci in ((1, cin), (2, cout)):
            setattr(self, f"conv{i}", nn.Conv3d(ci, cout, 3, padding=1))
            if norm == "batch":
                n = nn.BatchNorm3d(cout, eps=eps, momentum=momentum)
            elif norm == "group":
                n = nn.GroupNorm(groups, cout, eps=eps)
            else:
                n = nn.InstanceNorm3d(cout, eps=eps, affine=True)
            setattr(self, f"norm{i}", n)

    def forward(self, x):
        x = F.relu(self.norm1(self.conv1(x)))
        return F.relu(self.norm2(self.conv2(x)))


class UNet3D(nn.Module):
    """The UNet3D of docs/engine.md with tessera's parameter names."""

    def __init__(self, channels, cin, classes, norm, groups=8, eps=1e-5, momentum=0.1):
        super().__init__()
        L = len(channels)
        self.L = L
        for l in range(L):
            setattr(self, f"enc{l}", Block(cin if l == 0 else channels[l - 1], channels[l], norm, groups, eps, momentum))
        for l in range(L - 2, -1, -1):
            setattr(self, f"up{l}", nn.ConvTranspose3d(channels[l + 1], channels[l], 2, stride=2))
            setattr(self, f"dec{l}", Block(2 * channels[l], channels[l], norm, groups, eps, momentum))
        self.head = nn.Conv3d(channels[0], classes, 1)

    def forward(self, x):
        skips = []
        for l in range(self.L):
            if l:
                x = F.max_pool3d(x, 2)
            x = getattr(self, f"enc{l}")(x)
            skips.append(x)
        for l in range(self.L - 2, -1, -1):
            x = getattr(self, f"up{l}")(x)
            x = torch.cat([x, skips[l]], 1)
            x = getattr(self, f"dec{l}")(x)
        return self.head(x)


def dice_loss(logits, label, classes, ignore, smooth=1e-5):
    """Soft Dice as documented for tessera (MONAI DiceLoss semantics)."""
    p = F.softmax(logits, 1)
    keep = (label != ignore).unsqueeze(1).to(p.dtype) if ignore >= 0 else torch.ones_like(p[:, :1])
    lab = torch.where(label == ignore, torch.zeros_like(label), label) if ignore >= 0 else label
    g = F.one_hot(lab.long(), classes).permute(0, 4, 1, 2, 3).to(p.dtype)
    p, g = p * keep, g * keep
    dims = (2, 3, 4)
    inter = (p * g).sum(dims)
    den = p.sum(dims) + g.sum(dims)
    return (1 - (2 * inter + smooth) / (den + smooth)).mean()


def loss_fn(logits, label, case):
    ign = case.get("ignore_index", -1)
    w = case.get("class_weights")
    total = 0
    terms = case["loss"].split("+")
    if "ce" in terms:
        wt = torch.tensor(w, dtype=logits.dtype) if w else None
        total = total + F.cross_entropy(logits, label.long(), weight=wt, ignore_index=ign if ign >= 0 else -100)
    if "dice" in terms:
        total = total + dice_loss(logits, label, logits.shape[1], ign)
    return total


CASES = [
    dict(name="bn-sgd", channels=[4, 8, 16], norm="batch", loss="ce", opt="sgd", lr=0.1, momentum=0.9,
         weight_decay=1e-3, nesterov=False, input="input.h5", train=True),
    # adam_eps 1e-4: the gradients of conv biases in front of batch norm are zero in exact arithmetic
    # (~1e-17 here, ~1e-8 float32 noise in any float32 implementation); Adam divides them by their own
    # magnitude, so with eps 1e-8 their update would be noise of size lr. 1e-4 keeps that noise below the
    # tolerance and the other gradients (1e-3 and more) in Adam's normalised regime.
    dict(name="bn-adamw", channels=[4, 8], norm="batch", loss="ce+dice", opt="adamw", lr=0.01, weight_decay=0.05,
         adam_eps=1e-4, input="input-ignore.h5", ignore_index=255, class_weights=[0.5, 1.0, 2.0], train=True),
    dict(name="gn-sgd", channels=[4, 8], norm="group", groups=4, loss="ce", opt="sgd", lr=0.1, momentum=0.9,
         weight_decay=1e-3, nesterov=True, input="input-ignore.h5", ignore_index=255, class_weights=[2.0, 1.0, 0.5],
         train=True),
    # groups 2 (not 4 = one channel per group at level 0, where conv biases cancel as under batch norm)
    # adam_eps 1e-6: Adam's first step moves each weight by lr g / (|g| + eps); for a gradient of ~1e-9
    # (one here) float32 noise of 1e-11 in g changes that by ~1%. eps 1e-6 keeps such updates well-conditioned.
    dict(name="gn-adamw", channels=[4, 8], norm="group", groups=2, loss="dice", opt="adamw", lr=0.01,
         weight_decay=0.01, adam_eps=1e-6, input="input.h5", train=True),
    dict(name="in-sgd", channels=[4, 8], norm="instance", loss="ce+dice", opt="sgd", lr=0.05, momentum=0.0,
         weight_decay=0.0, nesterov=False, input="input.h5", train=True),
    dict(name="bn-eval", channels=[4, 8], norm="batch", loss="ce", opt="sgd", lr=0.01, momentum=0.9,
         weight_decay=0.0, nesterov=False, input="input.h5", train=False),
]
CIN, K, SHAPE, N = 2, 3, (8, 12, 16), 2


def write_inputs():
    g = torch.Generator().manual_seed(1)
    image = torch.randn((N, CIN) + SHAPE, generator=g)
    label = torch.randint(0, K, (N,) + SHAPE, generator=g).to(torch.uint8)
    with h5py.File(os.path.join(HERE, "input.h5"), "w") as f:
        f["image"] = image.numpy()
        f["label"] = label.numpy()
    label_i = label.clone()
    label_i[torch.rand(label.shape, generator=g) < 0.2] = 255
    with h5py.File(os.path.join(HERE, "input-ignore.h5"), "w") as f:
        f["image"] = image.numpy()
        f["label"] = label_i.numpy()


def read_input(name):
    with h5py.File(os.path.join(HERE, name), "r") as f:
        return torch.from_numpy(f["image"][...]), torch.from_numpy(f["label"][...])


def write_ini(case):
    lines = ["# golden case %s (written by tests/golden/make_golden.py)" % case["name"], "[model]",
             "channels = " + ",".join(map(str, case["channels"])), "in_channels = %d" % CIN, "classes = %d" % K,
             "norm = " + case["norm"]]
    if case["norm"] == "group":
        lines.append("groups = %d" % case["groups"])
    lines += ["", "[data]", "patch = " + ",".join(map(str, SHAPE)), "", "[train]", "batch = %d" % N,
              "loss = " + case["loss"], "optimizer = " + case["opt"], "lr = %g" % case["lr"],
              "weight_decay = %g" % case["weight_decay"]]
    if "adam_eps" in case:
        lines.append("adam_eps = %g" % case["adam_eps"])
    if case["opt"] == "sgd":
        lines += ["momentum = %g" % case["momentum"], "nesterov = %s" % ("true" if case["nesterov"] else "false")]
    if "ignore_index" in case:
        lines.append("ignore_index = %d" % case["ignore_index"])
    if "class_weights" in case:
        lines.append("class_weights = " + ",".join("%g" % w for w in case["class_weights"]))
    with open(os.path.join(HERE, case["name"] + ".ini"), "w") as f:
        f.write("\n".join(lines) + "\n")


def save_state(f, group, sd):
    for k, v in sd.items():
        f[group + "/" + k] = v.detach().numpy() if v.dtype == torch.int64 else v.detach().float().numpy()


def main():
    write_inputs()
    for ci, case in enumerate(CASES):
        torch.manual_seed(100 + ci)
        m = UNet3D(case["channels"], CIN, K, case["norm"], case.get("groups", 8))
        if not case["train"]:  # non-trivial running statistics for eval mode
            for mod in m.modules():
                if isinstance(mod, nn.BatchNorm3d):
                    mod.running_mean.uniform_(-0.5, 0.5)
                    mod.running_var.uniform_(0.5, 2.0)
                    mod.num_batches_tracked.fill_(7)
        write_ini(case)
        with h5py.File(os.path.join(HERE, case["name"] + "-weights.h5"), "w") as f:
            save_state(f, "params", m.state_dict())
        image, label = read_input(case["input"])
        m = m.double()
        m.train(case["train"])
        logits = m(image.double())
        out = {"logits": logits}
        if case["train"]:
            loss = loss_fn(logits, label, case)
            out["loss"] = loss
            loss.backward()
            grads = {k: p.grad.detach().clone() for k, p in m.named_parameters()}
            if case["opt"] == "sgd":
                opt = torch.optim.SGD(m.parameters(), lr=case["lr"], momentum=case["momentum"],
                                      weight_decay=case["weight_decay"], nesterov=case["nesterov"])
            else:
                opt = torch.optim.AdamW(m.parameters(), lr=case["lr"], weight_decay=case["weight_decay"],
                                        eps=case.get("adam_eps", 1e-8))
            opt.step()
        else:
            out["loss"] = loss_fn(logits, label, case)
        with h5py.File(os.path.join(HERE, case["name"] + "-expect.h5"), "w") as f:
            f["logits"] = out["logits"].detach().float().numpy()
            f["loss"] = out["loss"].detach().numpy()
            if case["train"]:
                for k, v in grads.items():
                    f["grads/" + k] = v.float().numpy()
                save_state(f, "params", m.state_dict())
        print("wrote", case["name"], "loss %.6f" % out["loss"].item())
    with open(os.path.join(HERE, "cases.txt"), "w") as f:
        f.write("# case input mode (read by tests/model/golden.sh)\n")
        for case in CASES:
            f.write("%s %s %s\n" % (case["name"], case["input"], "train-step" if case["train"] else "eval"))


if __name__ == "__main__":
    main()
