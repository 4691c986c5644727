#!/usr/bin/env python3
"""Writes the generated part of the fuzz seed corpus (tests/fuzz/corpus/):
tiny NIfTI files made by nibabel (independent of tessera's writer), byte
strings for the structure-aware dataset target, and JSON inputs. Rerun it
from the top of the tree with Debian's python3 (numpy, nibabel):
    /usr/bin/python3 tests/fuzz/make_corpus.py
The tuning table and the configs in the corpus come from tessera itself
(`tessera bench coll --tune`, configs/); see docs/testing.md."""
import gzip, io, json, os, random
import numpy as np
import nibabel as nib

top = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
rng = np.random.default_rng(7)


def nii_bytes(img):
    bio = io.BytesIO()
    fh = nib.FileHolder(fileobj=bio)
    img.to_file_map({"image": fh, "header": fh})
    return bio.getvalue()


def save(sub, name, data):
    os.makedirs(os.path.join(top, sub), exist_ok=True)
    with open(os.path.join(top, sub, name), "wb") as f:
        f.write(data)


aff = np.diag([1.5, 1.0, 2.0, 1.0])
aff[:3, 3] = [-10, 5, 3]
cases = {
    "f32-2x3x4.nii": nib.Nifti1Image(rng.normal(size=(2, 3, 4)).astype(np.float32), aff),
    "u8-label-3x3x3.nii": nib.Nifti1Image(rng.integers(0, 3, size=(3, 3, 3)).astype(np.uint8), np.eye(4)),
    "i16-4x2x2.nii": nib.Nifti1Image(rng.integers(-300, 300, size=(4, 2, 2)).astype(np.int16), aff),
    "f64-4d-2x2x2x2.nii": nib.Nifti1Image(rng.normal(size=(2, 2, 2, 2)), aff),
    "u16-2x2x3.nii": nib.Nifti1Image(rng.integers(0, 60000, size=(2, 2, 3)).astype(np.uint16), aff),
    "nifti2-f32-2x2x2.nii": nib.Nifti2Image(rng.normal(size=(2, 2, 2)).astype(np.float32), aff),
}
for name, img in cases.items():
    save("nifti", name, nii_bytes(img))
# scaled int16 (scl_slope/scl_inter)
img = nib.Nifti1Image(rng.integers(0, 100, size=(3, 2, 2)).astype(np.int16), aff)
img.header.set_slope_inter(0.5, -3)
save("nifti", "i16-scaled-3x2x2.nii", nii_bytes(img))
# big-endian header and data
img = nib.Nifti1Image(rng.normal(size=(2, 2, 3)).astype(">f4"), aff)
save("nifti", "f32-bigendian-2x2x3.nii", nii_bytes(img))
# gzip
save("nifti", "f32-2x3x4.nii.gz", gzip.compress(nii_bytes(cases["f32-2x3x4.nii"]), mtime=0))
# one NaN voxel
a = rng.normal(size=(2, 2, 2)).astype(np.float32)
a[1, 0, 1] = np.nan
save("nifti", "f32-nan-2x2x2.nii", nii_bytes(nib.Nifti1Image(a, aff)))

# dataset target: the input is a list of choices (tests/fuzz/fuzz_dataset.c)
random.seed(11)
for k in range(3):
    save("dataset", "base%d-plain" % k, bytes([k, 0, 0x06]))
for k in range(24):
    save("dataset", "edits-%02d" % k, bytes(random.randrange(256) for _ in range(random.randrange(8, 64))))

# JSON readers (tests/fuzz/fuzz_json.c)
msd = {"name": "fuzz", "modality": {"0": "MRI"}, "labels": {"0": "background", "1": "thing"},
       "numTraining": 1, "training": [{"image": "./img.nii", "label": "./lab.nii"}], "test": []}
save("json", "msd-dataset.json", json.dumps(msd, indent=1).encode())
manifest = ('{\n  "format": "tessera-checkpoint",\n  "version": 1,\n  "step": 5,\n  "epoch": 0,\n'
            '  "sampler_position": 10,\n  "ranks": 2,\n  "tensors": 12,\n  "files": {"state.h5": 100}\n}\n')
save("json", "ckpt-manifest.json", manifest.encode())
calib = {"what": "bench step --calibrate", "rates_per_s": {"conv_forward": 1.5e9, "conv_weight_grad": 1.1e9,
         "conv_input_grad": 1.2e9, "transposed_conv": 9e8, "norm_relu": 3e8, "max_pool": 6e8, "loss": 2e8,
         "halo": 1e9, "other": 2e8}, "optimizer_s_per_param": 2e-9, "other_s_per_act_elem": 1e-9,
         "act_bytes_per_elem": 4, "process_mb": 300, "step_s": 0.5, "threads": 2}
save("json", "plan-calibration.json", json.dumps(calib, indent=1).encode())
table = {"version": 1, "entries": [
    {"op": "allreduce", "ranks": 1, "nodes": 1, "max_bytes": 4096, "algo": "ring"},
    {"op": "allreduce", "ranks": 1, "nodes": 1, "max_bytes": 1e15, "algo": "mpi"},
    {"op": "allgather", "ranks": 1, "nodes": 1, "max_bytes": 65536, "algo": "ring"},
    {"op": "bcast", "ranks": 1, "nodes": 1, "max_bytes": 1024, "algo": "binomial"},
    {"op": "reduce_scatter", "ranks": 1, "nodes": 1, "max_bytes": 1e6, "algo": "ring"}],
    "models": [{"op": "allreduce", "algo": "ring", "ranks": 2, "nodes": 1, "alpha_us": 3.5,
                "beta_ns_per_byte": 0.4, "max_rel_err": 0.1, "min_bytes": 8, "max_bytes": 67108864}]}
save("json", "tuning-1rank.json", json.dumps(table, indent=1).encode())
