#!/bin/sh
# Acceptance 2: an MSD task made from the mricron volumes (six cases of
# different sizes, crops and flips, NIfTI-1/2, .nii/.nii.gz, two modalities)
# converted on 2 ranks to 3 shards (and on 3 ranks to one file, written
# collectively); checked with h5py/nibabel; the sampler yields every sample
# exactly once per epoch on 1, 2 and 3 ranks with the same global order, and the
# loader on P ranks yields the same augmented patches as on one rank.
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
T=/usr/share/mricron/templates
if [ ! -f "$T/ch2.nii.gz" ] || [ ! -f "$T/ch2bet.nii.gz" ] || [ ! -f "$T/aal.nii.gz" ]; then
    echo "1..0 # SKIP mricron-data is not installed ($T)"; exit 0
fi
d=$(mktemp -d "${TMPDIR:-/tmp}/ts-io.XXXXXX") || exit 1
trap 'rm -rf "$d"' EXIT
tessera="$TS_BUILDDIR/tessera"
ts_step "make an MSD task folder with libnifti" "$TS_BUILDDIR/tests/io/mkmsd" "$T" "$d/Task01_Colin"
ts_step "convert msd on 2 ranks to 3 shards" \
    ts_mpirun 2 "$tessera" convert msd "$d/Task01_Colin" --out "$d/colin.h5" --shards 3 --chunk 16
ts_check "manifest and 3 shard files exist, no temporaries" \
    sh -c "[ -f '$d/colin.h5' ] && [ \$(ls '$d' | grep -c 'colin-shard-.*-of-00003.h5\$') -eq 3 ] && ! ls '$d' | grep -q partial"
ts_step "h5dump reads the manifest and follows its links" sh -c "h5dump -H '$d/colin.h5' >/dev/null"
ts_step "convert msd on 3 ranks to one file (collective writes)" \
    ts_mpirun 3 "$tessera" convert msd "$d/Task01_Colin" --out "$d/colin1.h5"
if [ -n "$TS_PY" ]; then
    ts_step "h5py/nibabel: the shards hold the NIfTI voxels" "$TS_PY" "$TS_SRCDIR/tests/io/check_msd.py" \
        "$d/colin.h5" "$d/Task01_Colin" 3
    ts_step "h5py/nibabel: the single file holds the NIfTI voxels" "$TS_PY" "$TS_SRCDIR/tests/io/check_msd.py" \
        "$d/colin1.h5" "$d/Task01_Colin" 1
else
    ts_skip "h5py/nibabel cross-checks" "no python3 with h5py, nibabel, numpy"
fi
for np in 1 2 3; do
    ts_step "sampler on $np rank(s): epochs are permutations, eval reads each sample once" \
        ts_mpirun $np "$TS_BUILDDIR/tests/io/test_sampler" "$d/colin.h5" "$d/order$np" 2 3
done
ts_check "the same global order on 1, 2 and 3 ranks" \
    sh -c "[ -s '$d/order1' ] && cmp -s '$d/order1' '$d/order2' && cmp -s '$d/order1' '$d/order3'"
ts_step "sampler on the single file, 2 ranks, batch 1" \
    ts_mpirun 2 "$TS_BUILDDIR/tests/io/test_sampler" "$d/colin1.h5" "$d/order1b" 1 3
ts_check "the single file gives the same order as the shards" cmp -s "$d/order1" "$d/order1b"
ts_step "synth 5 samples (the 5-samples-on-2-ranks case)" "$tessera" synth --out "$d/five.h5" --count 5 --size 12 --seed 3
ts_step "sampler with 5 samples on 2 ranks, batch 2: same steps everywhere, no hang" \
    ts_mpirun 2 "$TS_BUILDDIR/tests/io/test_sampler" "$d/five.h5" "$d/order5" 2 4
ts_step "bench io on 2 ranks writes its JSON" \
    ts_mpirun 2 "$tessera" bench io "$TS_SRCDIR/configs/unet3d-small.ini" "data.path=$d/five.h5" data.patch=8 \
    --steps 3 --repeat 2 --json "$d/io.json"
# 5 samples of 12^3, one chunk each: (12^3*4 + 4) + (12^3 + 4) bytes per sample
ts_check "bench io JSON: samples_per_s, read_GBps and bytes = 5 x 8648" \
    sh -c "tr -d ' \t\n' < '$d/io.json' | grep -q '\"bytes\":43240,' && grep -q samples_per_s '$d/io.json' && grep -q read_GBps '$d/io.json'"
ts_finish
