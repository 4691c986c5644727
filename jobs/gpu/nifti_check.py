#!/usr/bin/env python3
"""NIfTI-1 files for jobs/gpu/check.sh without numpy or nibabel (the GPU
machine has neither for sure): `write OUT.nii.gz` writes a 40x44x48 float32
phantom scan (two spheres of their own intensities in noise, a fixed
seed); `compare MASK_A MASK_B PROB_A PROB_B` reads tessera infer's uint8
masks and float32 probabilities and exits 0 when the masks agree on at
least 99.9 % of the voxels and the probabilities within 1e-4, printing
both figures."""
import gzip
import random
import struct
import sys
from array import array


def write(path):
    X, Y, Z = 40, 44, 48
    rnd = random.Random(5)
    data = array("f")
    for z in range(Z):
        for y in range(Y):
            for x in range(X):
                v = rnd.gauss(0.0, 0.05)
                if (x - 14) ** 2 + (y - 20) ** 2 + (z - 22) ** 2 < 81:
                    v += 1.0
                elif (x - 28) ** 2 + (y - 26) ** 2 + (z - 30) ** 2 < 64:
                    v += 0.5
                data.append(v)
    h = bytearray(352)
    struct.pack_into("<i", h, 0, 348)
    struct.pack_into("<8h", h, 40, 3, X, Y, Z, 1, 1, 1, 1)
    struct.pack_into("<hh", h, 70, 16, 32)  # float32, 32 bits
    struct.pack_into("<8f", h, 76, 1, 1, 1, 1, 1, 1, 1, 1)
    struct.pack_into("<ff", h, 108, 352.0, 1.0)  # vox_offset, scl_slope
    struct.pack_into("<hh", h, 252, 0, 1)  # qform_code, sform_code
    struct.pack_into("<12f", h, 280, 1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0)
    h[344:348] = b"n+1\0"
    if sys.byteorder != "little":
        data.byteswap()
    with gzip.open(path, "wb") as f:
        f.write(bytes(h) + data.tobytes())


def read(path):
    with gzip.open(path, "rb") as f:
        b = f.read()
    if struct.unpack_from("<i", b, 0)[0] != 348:
        raise SystemExit(f"{path}: not a little-endian NIfTI-1 file")
    dtype = struct.unpack_from("<h", b, 70)[0]
    off = int(struct.unpack_from("<f", b, 108)[0])
    code = {2: "B", 16: "f"}.get(dtype)
    if code is None:
        raise SystemExit(f"{path}: datatype {dtype} (uint8 or float32 expected)")
    a = array(code)
    a.frombytes(b[off:])
    if sys.byteorder != "little":
        a.byteswap()
    return a


def compare(ma, mb, pa, pb):
    a, b = read(ma), read(mb)
    if len(a) != len(b) or not a:
        raise SystemExit(f"masks of {len(a)} and {len(b)} voxels")
    same = sum(1 for u, v in zip(a, b) if u == v) / len(a)
    fg = sum(1 for v in b if v)
    p, q = read(pa), read(pb)
    if len(p) != len(q):
        raise SystemExit(f"probabilities of {len(p)} and {len(q)} values")
    diff = max(abs(u - v) for u, v in zip(p, q))
    print(f"masks {100 * same:.3f} % equal ({fg} foreground voxels on the CPU), probabilities within {diff:.2e}")
    return 0 if same >= 0.999 and diff <= 1e-4 else 1


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "write":
        write(sys.argv[2])
        return 0
    if len(sys.argv) == 6 and sys.argv[1] == "compare":
        return compare(*sys.argv[2:])
    raise SystemExit("usage: nifti_check.py write OUT.nii.gz | compare MASK_A MASK_B PROB_A PROB_B")


if __name__ == "__main__":
    sys.exit(main())
