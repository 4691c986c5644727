#!/usr/bin/python3
"""Generates the golden files of tests/golden with PyTorch (Debian's
python3-torch 1.13, python3-h5py): for each case a config (<case>.ini), the
initial weights (<case>-weights.h5, PyTorch's default initialisation) and
the expected results (<case>-expect.h5: /logits, /loss, and for train cases
/grads/<name> and /params/<name> after one optimizer step), computed in
float64 from the float32 weights and inputs (stored as float32, the loss as
float64). The inputs are input.h5 and
input-ignore.h5 (labels with the ignore value 255), and input-ds.h5 (a
patch deep enough for 4 levels). `make check` compares
`tessera model run` on these files with the expected results
(tests/model/golden.sh); it never runs this script.

Besides the plain UNet3D the cases cover the residual encoder
(model.arch = resenc), deep supervision and leaky ReLU (docs/engine.md).

Run from anywhere:  /usr/bin/python3 tests/golden/make_golden.py [CASE ...]
(with case names: only those cases, and inputs only where missing, so that
the committed files of the other cases stay as they are).
"""
import sys
import os
import h5py
import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))


def make_norm(norm, c, groups, eps, momentum):
    if norm == "batch":
        return nn.BatchNorm3d(c, eps=eps, momentum=momentum)
    if norm == "group":
        return nn.GroupNorm(groups, c, eps=eps)
    return nn.InstanceNorm3d(c, eps=eps, affine=True)


def make_act(act, slope):
    return (lambda x: F.leaky_relu(x, slope)) if act == "leaky_relu" else F.relu


class Block(nn.Module):
    def __init__(self, cin, cout, norm, groups, eps, momentum, act="relu", slope=0.01):
        super().__init__()
        self.act = make_act(act, slope)
        for i, ci in ((1, cin), (2, cout)):
            setattr(self, f"conv{i}", nn.Conv3d(ci, cout, 3, padding=1))
            setattr(self, f"norm{i}", make_norm(norm, cout, groups, eps, momentum))

    def forward(self, x):
        x = self.act(self.norm1(self.conv1(x)))
        return self.act(self.norm2(self.conv2(x)))


class ConvNorm(nn.Module):
    """conv (k 3 padding 1, or k 1 padding 0; with bias) and norm: the stem, a skip projection."""

    def __init__(self, cin, cout, k, stride, norm, groups, eps, momentum):
        super().__init__()
        self.conv = nn.Conv3d(cin, cout, k, stride=stride, padding=k // 2)
        self.norm = make_norm(norm, cout, groups, eps, momentum)

    def forward(self, x):
        return self.norm(self.conv(x))


class ResBlock(nn.Module):
    """nnU-Net's residual block: conv1-norm1-act-conv2-norm2, plus the input (or a 1x1x1 conv + norm where
    channels or stride change), act after the sum."""

    def __init__(self, cin, cout, stride, norm, groups, eps, momentum, act, slope):
        super().__init__()
        self.act = make_act(act, slope)
        self.conv1 = nn.Conv3d(cin, cout, 3, stride=stride, padding=1)
        self.norm1 = make_norm(norm, cout, groups, eps, momentum)
        self.conv2 = nn.Conv3d(cout, cout, 3, padding=1)
        self.norm2 = make_norm(norm, cout, groups, eps, momentum)
        self.skip = ConvNorm(cin, cout, 1, stride, norm, groups, eps, momentum) if cin != cout or stride != 1 else None

    def forward(self, x):
        y = self.norm2(self.conv2(self.act(self.norm1(self.conv1(x)))))
        return self.act(y + (self.skip(x) if self.skip is not None else x))


class Stage(nn.Module):
    def __init__(self, blocks):
        super().__init__()
        self.n = len(blocks)
        for j, b in enumerate(blocks):
            setattr(self, f"block{j}", b)

    def forward(self, x):
        for j in range(self.n):
            x = getattr(self, f"block{j}")(x)
        return x


def ds_weights(L):
    """nnU-Net's deep supervision weights of the decoder outputs at levels 0 .. L-2: 1/2^l, the lowest 0,
    normalised."""
    w = [1 / 2 ** i for i in range(L - 1)]
    w[-1] = 0
    return [v / sum(w) for v in w]


class UNet3D(nn.Module):
    """The UNet3D of docs/engine.md with tessera's parameter names; arch "resenc": the residual encoder
    (stem, res_blocks[l] residual blocks per level, the first of levels l > 0 with stride 2) with the same
    decoder; deep_supervision: heads ds1 .. ds{L-3}. forward returns the logits of levels 0, 1, ..."""

    def __init__(self, channels, cin, classes, norm, groups=8, eps=1e-5, momentum=0.1, arch="unet",
                 res_blocks=None, deep_supervision=False, act="relu", slope=0.01):
        super().__init__()
        L = len(channels)
        self.L, self.arch, self.ds = L, arch, deep_supervision
        nargs = (norm, groups, eps, momentum)
        if arch == "resenc":
            self.stem = ConvNorm(cin, channels[0], 3, 1, *nargs)
            self.stem_act = make_act(act, slope)
            for l in range(L):
                blocks = []
                for j in range(res_blocks[l]):
                    ci = channels[l] if j else channels[l - 1] if l else channels[0]
                    blocks.append(ResBlock(ci, channels[l], 2 if l and not j else 1, *nargs, act, slope))
                setattr(self, f"enc{l}", Stage(blocks))
        else:
            for l in range(L):
                setattr(self, f"enc{l}", Block(cin if l == 0 else channels[l - 1], channels[l], *nargs, act, slope))
        self.ds_levels = [l for l, w in enumerate(ds_weights(L)) if l > 0 and w > 0] if deep_supervision else []
        for l in range(L - 2, -1, -1):
            setattr(self, f"up{l}", nn.ConvTranspose3d(channels[l + 1], channels[l], 2, stride=2))
            setattr(self, f"dec{l}", Block(2 * channels[l], channels[l], *nargs, act, slope))
            if l in self.ds_levels:
                setattr(self, f"ds{l}", nn.Conv3d(channels[l], classes, 1))
        self.head = nn.Conv3d(channels[0], classes, 1)

    def forward(self, x):
        skips = []
        if self.arch == "resenc":
            x = self.stem_act(self.stem(x))
        for l in range(self.L):
            if l and self.arch != "resenc":
                x = F.max_pool3d(x, 2)
            x = getattr(self, f"enc{l}")(x)
            skips.append(x)
        outs = {}
        for l in range(self.L - 2, -1, -1):
            x = getattr(self, f"up{l}")(x)
            x = torch.cat([x, skips[l]], 1)
            x = getattr(self, f"dec{l}")(x)
            if l in self.ds_levels:
                outs[l] = getattr(self, f"ds{l}")(x)
        outs[0] = self.head(x)
        return [outs[l] for l in sorted(outs)]


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


def downsample_labels(label, level):
    """nearest-exact (nnU-Net v2's label downsampling for deep supervision): voxel i of level l is voxel
    2^l i + 2^(l-1)."""
    if level == 0:
        return label
    size = [s >> level for s in label.shape[1:]]
    return F.interpolate(label[:, None].double(), size=size, mode="nearest-exact")[:, 0].to(label.dtype)


def ds_loss_fn(outs, label, case):
    """the loss of the outputs of levels 0, l1, l2, ... (deep supervision: weighted as nnU-Net)"""
    if not case.get("deep_supervision"):
        return loss_fn(outs[0], label, case)
    w = ds_weights(len(case["channels"]))
    levels = [0] + [l for l in range(1, len(w)) if w[l] > 0]
    return sum(w[l] * loss_fn(o, downsample_labels(label, l), case) for l, o in zip(levels, outs))


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
    # the residual encoder (strided convs 8x12x16 -> 4x6x8 -> 2x3x4) with nnU-Net's instance norm + leaky ReLU
    dict(name="resenc-in-sgd", arch="resenc", res_blocks=[1, 2, 1], channels=[4, 8, 8], norm="instance",
         act="leaky_relu", loss="ce+dice", opt="sgd", lr=0.05, momentum=0.9, weight_decay=1e-3, nesterov=False,
         input="input.h5", train=True),
    # deep supervision on the plain UNet3D (4 levels: outputs at levels 0, 1, 2 weighted 4/6, 2/6, 0)
    dict(name="ds-bn-sgd", channels=[4, 4, 8, 8], deep_supervision=True, norm="batch", loss="ce", opt="sgd", lr=0.1,
         momentum=0.9, weight_decay=1e-3, nesterov=True, input="input-ds.h5", train=True),
    # both, with group norm, leaky ReLU and ignored labels
    dict(name="resenc-ds-gn-sgd", arch="resenc", res_blocks=[1, 2, 1, 1], channels=[4, 4, 8, 8],
         deep_supervision=True, norm="group", groups=2, act="leaky_relu", loss="ce+dice", opt="sgd", lr=0.05,
         momentum=0.9, weight_decay=0.0, nesterov=False, input="input-ds-ignore.h5", ignore_index=255,
         class_weights=[1.0, 2.0, 0.5], train=True),
    # the residual encoder in eval mode (batch norm's running statistics)
    dict(name="resenc-bn-eval", arch="resenc", res_blocks=[2, 1], channels=[4, 8], norm="batch", loss="ce",
         opt="sgd", lr=0.01, momentum=0.9, weight_decay=0.0, nesterov=False, input="input.h5", train=False),
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


DS_SHAPE = (8, 16, 16)


def write_inputs_ds():
    g = torch.Generator().manual_seed(2)
    image = torch.randn((N, CIN) + DS_SHAPE, generator=g)
    label = torch.randint(0, K, (N,) + DS_SHAPE, generator=g).to(torch.uint8)
    label_i = label.clone()
    label_i[torch.rand(label.shape, generator=g) < 0.2] = 255
    for name, lab in (("input-ds.h5", label), ("input-ds-ignore.h5", label_i)):
        with h5py.File(os.path.join(HERE, name), "w") as f:
            f["image"] = image.numpy()
            f["label"] = lab.numpy()


def read_input(name):
    with h5py.File(os.path.join(HERE, name), "r") as f:
        return torch.from_numpy(f["image"][...]), torch.from_numpy(f["label"][...])


def write_ini(case):
    lines = ["# golden case %s (written by tests/golden/make_golden.py)" % case["name"], "[model]",
             "channels = " + ",".join(map(str, case["channels"])), "in_channels = %d" % CIN, "classes = %d" % K,
             "norm = " + case["norm"]]
    if case["norm"] == "group":
        lines.append("groups = %d" % case["groups"])
    if case.get("arch", "unet") != "unet":
        lines += ["arch = " + case["arch"], "res_blocks = " + ",".join(map(str, case["res_blocks"]))]
    if case.get("deep_supervision"):
        lines.append("deep_supervision = true")
    if case.get("act", "relu") != "relu":
        lines.append("act = " + case["act"])
    shape = DS_SHAPE if case["input"].startswith("input-ds") else SHAPE
    lines += ["", "[data]", "patch = " + ",".join(map(str, shape)), "", "[train]", "batch = %d" % N,
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


def main(names):
    unknown = set(names) - {c["name"] for c in CASES}
    if unknown:
        sys.exit("unknown case(s): " + " ".join(sorted(unknown)))
    if not names or not all(os.path.exists(os.path.join(HERE, f)) for f in ("input.h5", "input-ignore.h5")):
        write_inputs()
    if not names or not all(os.path.exists(os.path.join(HERE, f)) for f in ("input-ds.h5", "input-ds-ignore.h5")):
        write_inputs_ds()
    for ci, case in enumerate(CASES):
        if names and case["name"] not in names:
            continue
        torch.manual_seed(100 + ci)
        m = UNet3D(case["channels"], CIN, K, case["norm"], case.get("groups", 8), arch=case.get("arch", "unet"),
                   res_blocks=case.get("res_blocks"), deep_supervision=case.get("deep_supervision", False),
                   act=case.get("act", "relu"))
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
        outs = m(image.double())
        out = {"logits": outs[0]}
        if case["train"]:
            loss = ds_loss_fn(outs, label, case)
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
            out["loss"] = ds_loss_fn(outs, label, case)
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
    main(sys.argv[1:])
