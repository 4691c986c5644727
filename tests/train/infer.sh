#!/bin/sh
# tessera infer as medical users run it (issue [11], "Evaluation and
# inference"): a folder, a comma list and a list file of scans, each mask
# with its scan's geometry; per-class Dice, HD95 and NSD in the metrics file
# against NumPy/SciPy (tests/train/infer_ref.py); test-time mirroring equal
# to the mean of the 8 flipped predictions flipped back, on 2 data-parallel
# ranks, on a spatial group and through pipeline stages; largest-component
# post-processing, and its decision on validation scans, against SciPy;
# bad lists and options fail on every rank before anything is written;
# windows per forward and streams change nothing, bf16 stays close to fp32, Winograd
# convolutions close to the direct ones, the closing line and `bench infer`
# time the parts (issue [17]).
. "$TS_SRCDIR/tests/train/lib_train.sh"
ts_use_gpus # the GPU checks below run where a GPU is visible (tests/mpi/lib.sh)
if [ -z "$TS_PY" ] || ! "$TS_PY" -c 'import scipy.ndimage' 2>/dev/null; then
    echo "1..0 # SKIP no python3 with h5py, nibabel and scipy"
    exit 0
fi
ref() { "$TS_PY" "$TS_SRCDIR/tests/train/infer_ref.py" "$@"; }
ts_tmpdir infer

ts_synth 3 20 7 1
# train.engine = cpu: the CPU's inference paths below (the GPU's, where one is visible, at the end)
ts_ini i.ini model.channels=4,8 model.norm=instance -model.groups train.batch=1 train.loss=ce -train.log_every train.engine=cpu
ts_step "train 6 steps" train_run 1 run
ts_step "scans a, b, c_0000 with three geometries, their labels, b flipped 8 ways" ref make "$d/syn.h5" "$d"
I="$TESSERA infer $d/i.ini checkpoint=$d/run"
infer() { # infer NP ARGS...: $I on NP ranks
    _n=$1
    shift
    # shellcheck disable=SC2086
    ts_mpirun "$_n" $I "$@"
}

# a folder of scans, labels matched by name: masks, geometry, metrics
ts_step "infer a folder of 3 scans with a label folder, 2 ranks" infer 2 input="$d/scans" output="$d/out" \
    label="$d/labels" nsd_tol=1.5
ts_check "each of the 3 scans printed once" \
    [ "$(printf '%s\n' "$ts_out" | grep -c '^infer: \[[123]/3\]')" -eq 3 ]
ts_step "each mask has its scan's dimensions, voxel sizes, affine and sform/qform codes" ref geometry "$d/scans" "$d/out"
ts_step "metrics.json: per-scan Dice, HD95, NSD (1.5 mm) and mean/std against NumPy/SciPy" \
    ref metrics "$d/out/metrics.json" "$d/labels" 1.5
ts_step "one scan: the mask of the folder run" infer 1 input="$d/single/b.nii.gz" output="$d/b1.nii.gz" \
    label="$d/labels/b.nii.gz"
ts_check "one scan: metrics next to the mask (b1.metrics.json)" [ -s "$d/b1.metrics.json" ]
ts_step "one scan: the same mask as in the folder run" ref same "$d/b1.nii.gz" "$d/out/b.nii.gz"
printf '# a comment\n%s\n\n%s\n' "$d/scans/a.nii.gz" "$d/scans/c_0000.nii.gz" >"$d/list.txt"
ts_step "a list file and a comma list" sh -c "timeout -k 10 300 $MPIEXEC -n 1 $I input='$d/list.txt' output='$d/lst' >/dev/null &&
    timeout -k 10 300 $MPIEXEC -n 1 $I input='$d/scans/a.nii.gz,$d/scans/c_0000.nii.gz' output='$d/cm'"
ts_check "both wrote a.nii.gz and c_0000.nii.gz, the folder run's masks" sh -c \
    "cmp '$d/lst/a.nii.gz' '$d/cm/a.nii.gz' && cmp '$d/lst/c_0000.nii.gz' '$d/cm/c_0000.nii.gz' &&
     [ ! -e '$d/lst/b.nii.gz' ] && [ ! -e '$d/lst/metrics.json' ]"

# test-time mirroring
ts_step "the 8 flipped copies of b, with probabilities, 2 ranks" infer 2 input="$d/flips" output="$d/fo" \
    probabilities="$d/fp"
ts_step "mirror=xyz on b, 2 data-parallel ranks" infer 2 input="$d/single/b.nii.gz" output="$d/bm.nii.gz" \
    probabilities="$d/bm_p.nii.gz" mirror=xyz
ts_step "mirror=xyz = mean of the 8 flipped predictions flipped back (1e-5), and not the unmirrored one" \
    ref mirror "$d/bm_p.nii.gz" "$d/fp"
ts_step "mirror=xyz on a spatial group (parallel.sp = 2)" infer 2 input="$d/single/b.nii.gz" \
    output="$d/bs.nii.gz" probabilities="$d/bs_p.nii.gz" mirror=xyz parallel.sp=2
ts_step "the spatial group's mirrored probabilities are the data-parallel ones (1e-5)" \
    ref same "$d/bm_p.nii.gz" "$d/bs_p.nii.gz"
ts_step "mirror=xyz through 2 pipeline stages (parallel.pp = 2)" infer 2 input="$d/single/b.nii.gz" \
    output="$d/bp.nii.gz" probabilities="$d/bp_p.nii.gz" mirror=xyz parallel.pp=2
ts_step "the pipeline's mirrored probabilities are the data-parallel ones (1e-5)" \
    ref same "$d/bm_p.nii.gz" "$d/bp_p.nii.gz"

# post-processing
ts_step "keep_largest=all on b" infer 1 input="$d/single/b.nii.gz" output="$d/bk.nii.gz" keep_largest=all
ts_step "the largest 26-connected component of classes 1 and 2 kept, as SciPy's ndimage.label" \
    ref keep "$d/out/b.nii.gz" "$d/bk.nii.gz" 1,2
ts_step "decide= on the 3 validation scans" infer 2 input="$d/scans" output="$d/dec" label="$d/labels" \
    decide="$d/pp.json"
ts_step "the decision: largest component where it raises the class's mean Dice (SciPy)" \
    ref decide "$d/dec" "$d/labels" "$d/pp.json"
ts_step "postprocess=pp.json applied to the 3 scans" infer 2 input="$d/scans" output="$d/app" \
    postprocess="$d/pp.json"
ts_step "the decided classes' largest components kept, the others untouched" ref applied "$d/dec" "$d/app" "$d/pp.json"
ts_step "validation labels on which the post-processing helps: the masks with only their largest components" \
    ref pplabels "$d/dec" "$d/pplab"
ts_step "decide= on them" infer 2 input="$d/scans" output="$d/dec2" label="$d/pplab" decide="$d/pp2.json"
# The model predicts one foreground class (2, in several pieces) and no class 1, so these labels have no
# class 1 either: class 1 has no Dice in any scan, nnU-Net's mean over the classes is NaN and the
# whole-foreground step is not taken; class 2's own step is.
ts_step "the decision: no whole-foreground step (a class in no scan), class 2 kept (SciPy's means)" \
    ref decide "$d/dec2" "$d/pplab" "$d/pp2.json" 2
ts_step "postprocess=pp2.json applied" infer 1 input="$d/scans" output="$d/app2" postprocess="$d/pp2.json"
ts_step "class 2's largest components kept: the masks are the validation labels" \
    ref applied "$d/dec2" "$d/app2" "$d/pp2.json"
# the masks with only the whole foreground's largest component, and a class-1 corner in each (missed by the
# model: Dice 0 with or without post-processing, but every class has a Dice)
ts_step "validation labels = the masks' largest foreground component, plus a class-1 corner" \
    ref pplabels "$d/dec" "$d/fglab" foreground
ts_step "decide= on them" infer 2 input="$d/scans" output="$d/dec3" label="$d/fglab" decide="$d/pp3.json"
ts_step "the decision takes nnU-Net's whole-foreground step, then no class (SciPy's means)" \
    ref decide "$d/dec3" "$d/fglab" "$d/pp3.json" foreground
ts_step "postprocess=pp3.json applied" infer 1 input="$d/scans" output="$d/app3" postprocess="$d/pp3.json"
ts_step "the foreground's largest components kept" ref applied "$d/dec3" "$d/app3" "$d/pp3.json"
ts_step "keep_largest=foreground,2 by hand" infer 1 input="$d/single/b.nii.gz" output="$d/bf.nii.gz" \
    keep_largest=foreground,2
ts_step "the foreground's largest component, then class 2's (SciPy)" \
    "$TS_PY" -c "
import sys; sys.path.insert(0, '$TS_SRCDIR/tests/train')
import infer_ref as r
a, b = r.load('$d/out/b.nii.gz'), r.load('$d/bf.nii.gz')
assert (r.keep_largest(a, [2], True) == b).all() and (a != b).any()
print('voxels removed', int((a != b).sum()))"

# windows per forward, bf16, where the time went, bench infer (issue [17])
ts_step "b with 1 window a forward, probabilities" infer 1 input="$d/single/b.nii.gz" output="$d/w1.nii.gz" \
    probabilities="$d/w1_p.nii.gz" batch=1
ts_step "b with 3 windows a forward" infer 1 input="$d/single/b.nii.gz" output="$d/w3.nii.gz" \
    probabilities="$d/w3_p.nii.gz" batch=3
ts_check "the closing line: 3 windows a forward, fp32, the network and the blending timed" sh -c \
    'printf "%s\n" "$1" | grep -qE "^infer: [0-9.]+ s: set-up [0-9.]+, reading [0-9.]+, prediction [0-9.]+ \(network [0-9.]+: [1-9][0-9]* windows in [1-9][0-9]* forwards of 3, fp32 winograd, [0-9.]+ GFLOP/s; blending [0-9.]+"' \
    _ "$ts_out"
ts_check "batch= changes nothing: the same mask and probability files, bit for bit" \
    sh -c "cmp '$d/w1.nii.gz' '$d/w3.nii.gz' && cmp '$d/w1_p.nii.gz' '$d/w3_p.nii.gz'"
# streams=2: two forwards at once on a rank of 2 threads, each on its own batches with its own copy of
# the model, their probabilities added in the order of one stream
export OMP_NUM_THREADS=2
ts_step "b on 2 streams of 1 window a forward (2 threads), probabilities" infer 1 input="$d/single/b.nii.gz" \
    output="$d/s2.nii.gz" probabilities="$d/s2_p.nii.gz" batch=1 streams=2
ts_check "the closing line says 2 streams and the forwards each ran" sh -c 'printf "%s\n" "$1" | grep -qE "forwards of 1 on 2 streams \([0-9]+ to [0-9]+ a stream\), fp32 winograd,"' \
    _ "$ts_out"
ts_check "streams= changes nothing: the mask and probabilities of 1 stream, bit for bit" \
    sh -c "cmp '$d/w1.nii.gz' '$d/s2.nii.gz' && cmp '$d/w1_p.nii.gz' '$d/s2_p.nii.gz'"
# a stream on a CPU shared with a busy loop (the streams' threads bound to two CPUs, the loop on the
# second; windows overlapping by 0.9, so that the run lasts long enough for the scheduler to matter):
# the other stream takes more of the forwards (each takes the next when done; before, the two
# alternated and the fast one waited for the slow one every time), and the sums stay one stream's
cpus=$("$TS_PY" -c 'import os; c = sorted(os.sched_getaffinity(0)); print(*c[:2])')
if [ "$(echo "$cpus" | wc -w)" -lt 2 ] || ! command -v taskset > /dev/null; then
    ts_skip "2 streams, one on a shared CPU" "needs 2 CPUs in this process's set and taskset (CPUs: $cpus)"
else
    ts_step "b with windows overlapping by 0.9 on 1 stream, probabilities" infer 1 input="$d/single/b.nii.gz" \
        output="$d/o1.nii.gz" probabilities="$d/o1_p.nii.gz" batch=1 streams=1 eval.overlap=0.9
    timeout 300 taskset -c "${cpus#* }" sh -c 'while :; do :; done' &
    hog=$!
    export GOMP_CPU_AFFINITY="$cpus" OMP_PROC_BIND=true
    ts_step "... on 2 streams, the second one's CPU (${cpus#* }) shared with a busy loop" infer 1 \
        input="$d/single/b.nii.gz" output="$d/sh.nii.gz" probabilities="$d/sh_p.nii.gz" batch=1 streams=2 eval.overlap=0.9
    unset GOMP_CPU_AFFINITY OMP_PROC_BIND
    kill "$hog" 2> /dev/null
    wait "$hog" 2> /dev/null
    ts_check "... the stream on the shared CPU ran at most 0.8 of the other's forwards: $(printf '%s\n' "$ts_out" | grep -oE '[0-9]+ windows in [0-9]+ forwards of 1 on 2 streams \([0-9]+ to [0-9]+ a stream\)')" \
        sh -c 'set -- $(printf "%s\n" "$1" | sed -n "s/.*on 2 streams (\([0-9]*\) to \([0-9]*\) a stream).*/\1 \2/p"); [ $# -eq 2 ] && [ $(($1 * 5)) -le $(($2 * 4)) ]' \
        _ "$ts_out"
    ts_check "... and the probabilities of 1 stream, bit for bit" cmp "$d/o1_p.nii.gz" "$d/sh_p.nii.gz"
fi
ts_step "mirror=xyz on 2 streams, 2 ranks" infer 2 input="$d/single/b.nii.gz" output="$d/bm2.nii.gz" \
    probabilities="$d/bm2_p.nii.gz" mirror=xyz streams=2
ts_check "the same probabilities as mirror=xyz on 1 stream, bit for bit" cmp "$d/bm_p.nii.gz" "$d/bm2_p.nii.gz"
ts_step "b with neither batch= nor streams=, train.batch=2, 2 threads" infer 1 input="$d/single/b.nii.gz" \
    output="$d/sa.nii.gz" probabilities="$d/sa_p.nii.gz" train.batch=2
ts_check "the default: a stream a thread, 1 window a forward each" \
    sh -c 'printf "%s\n" "$1" | grep -qE "forwards of 1 on 2 streams \([0-9]+ to [0-9]+ a stream\), fp32 winograd,"' _ "$ts_out"
ts_check "the default streams: the probabilities of 1 stream, bit for bit" cmp "$d/w1_p.nii.gz" "$d/sa_p.nii.gz"
ts_step "b with batch=2 given, 2 threads" infer 1 input="$d/single/b.nii.gz" output="$d/sb.nii.gz" batch=2
ts_check "batch= given: 1 stream of 2 windows a forward" \
    sh -c 'printf "%s\n" "$1" | grep -qE "forwards of 2, fp32 winograd,"' _ "$ts_out"
ts_step "b with train.batch=3 on 2 threads" infer 1 input="$d/single/b.nii.gz" output="$d/sc.nii.gz" train.batch=3
ts_check "threads that do not divide train.batch: 1 stream" \
    sh -c 'printf "%s\n" "$1" | grep -qE "forwards of 3, fp32 winograd,"' _ "$ts_out"
export OMP_NUM_THREADS=4
ts_step "b on 2 streams of 2 threads each (nested regions), probabilities" infer 1 input="$d/single/b.nii.gz" \
    output="$d/s4.nii.gz" probabilities="$d/s4_p.nii.gz" batch=1 streams=2
ts_check "2 streams of 2 threads: the probabilities of 1 stream, bit for bit" cmp "$d/w1_p.nii.gz" "$d/s4_p.nii.gz"
export OMP_NUM_THREADS=2
ts_fails_on_all "streams=3 on 2 threads" "streams=3 is more than the 2 OpenMP threads of a rank" 2 \
    infer 2 input="$d/single/b.nii.gz" output="$d/e7.nii.gz" streams=3
ts_fails_on_all "streams=2 on a spatial group" "streams=2 needs parallel.sp = parallel.pp = 1" 2 \
    infer 2 input="$d/single/b.nii.gz" output="$d/e8.nii.gz" streams=2 parallel.sp=2
ts_check "neither wrote a mask" sh -c "[ ! -e '$d/e7.nii.gz' ] && [ ! -e '$d/e8.nii.gz' ]"
export OMP_NUM_THREADS=1
ts_step "b with 3 windows a forward on 2 ranks" infer 2 input="$d/single/b.nii.gz" output="$d/w32.nii.gz" \
    probabilities="$d/w32_p.nii.gz" batch=3
ts_step "2 ranks' probabilities are 1 rank's (1e-5: the windows' sums add in another order)" \
    ref same "$d/w1_p.nii.gz" "$d/w32_p.nii.gz"
ts_step "precision=bf16 on b, probabilities" infer 1 input="$d/single/b.nii.gz" output="$d/wb.nii.gz" \
    probabilities="$d/wb_p.nii.gz" precision=bf16
# the default conv: winograd, but direct where bf16 runs on AMX tiles (faster there)
bf16_default=winograd
[ "$("${TS_BUILDDIR:-.}/tests/nn/test_layers" isa 2>/dev/null)" = amx ] && bf16_default=direct
ts_check "the closing line says bf16, $bf16_default (the default with this CPU's bf16 kernels)" \
    sh -c 'printf "%s\n" "$1" | grep -qE "forwards of 1, bf16 $2,"' _ "$ts_out" "$bf16_default"
# close REF RUN BOUND AGREE: RUN's probabilities ($d/RUN_p.nii.gz) within BOUND of REF's and not
# equal to them, the masks ($d/RUN.nii.gz) equal on AGREE of the voxels, REF's spread beyond 0.1
close() {
    "$TS_PY" -c "
import sys; sys.path.insert(0, '$TS_SRCDIR/tests/train')
import infer_ref as r
import numpy as np
a, b = r.load('$d/$1_p.nii.gz'), r.load('$d/$2_p.nii.gz')
d = np.abs(a.astype(np.float64) - b)
agree = float((r.load('$d/$1.nii.gz') == r.load('$d/$2.nii.gz')).mean())
print('max |$2 - $1| %.3g, mean %.3g; masks agree on %.5f of the voxels; probabilities from %.3g to %.3g' % (d.max(), d.mean(), agree, a.min(), a.max()))
assert 0 < d.max() < $3 and agree >= $4 and a.max() - a.min() > 0.1"
}
ts_step "bf16 probabilities within 0.02 of fp32's, not equal to them; masks agree on 99 % of the voxels" \
    close w1 wb 0.02 0.99
ts_step "precision=bf16 on 2 streams (2 threads)" env OMP_NUM_THREADS=2 timeout -k 10 300 $MPIEXEC -n 1 $I \
    input="$d/single/b.nii.gz" output="$d/wb2.nii.gz" probabilities="$d/wb2_p.nii.gz" precision=bf16 streams=2
ts_check "bf16 on 2 streams: the probabilities of 1 stream, bit for bit" cmp "$d/wb_p.nii.gz" "$d/wb2_p.nii.gz"
ts_step "bench infer --repeat 2 --json on b" ts_mpirun 1 "$TESSERA" bench infer "$d/i.ini" checkpoint="$d/run" \
    input="$d/single/b.nii.gz" output="$d/bi.nii.gz" --repeat 2 --json "$d/bi.json"
ts_step "bench infer's JSON: 2 runs, the parts within the whole, windows, FLOP, GFLOP/s" "$TS_PY" -c "
import json
j = json.load(open('$d/bi.json'))
print({k: j[k] for k in ('total_s', 'predict_s', 'network_s', 'blend_s', 'windows', 'forwards', 'network_gflops')})
assert len(j['totals']) == 2 and j['precision'] == 'fp32' and j['windows'] > 0 and j['forwards'] > 0
assert 0 < j['network_s'] <= j['predict_s'] <= j['total_s'] and j['blend_s'] > 0
assert j['flop_per_window'] > 0 and abs(j['network_gflops'] - j['flop_per_window'] * j['windows'] / j['network_s'] / 1e9) < 1e-6 * j['network_gflops']
lo, hi, S, F = j['stream_forwards_min'], j['stream_forwards_max'], j['streams'], j['forwards']
print('streams', S, 'forwards a stream', lo, 'to', hi)
assert (S == 1 and lo == hi == 0) or (S > 1 and 1 <= lo <= hi and lo * S <= F <= hi * S)"
ts_check "bench infer wrote the mask infer writes" cmp "$d/bi.nii.gz" "$d/w1.nii.gz"

# conv=winograd (the default) against conv=direct on a model whose 3x3x3
# convolutions have 16 and 32 channels (all but the first run as Winograd
# ones), batch norm folded into their epilogues
ini_i=$ini
ts_ini w.ini model.channels=16,32 model.norm=batch -model.groups train.batch=1 train.loss=ce -train.log_every train.steps=3 \
    train.engine=cpu
ts_step "train a 16,32-channel batch-norm model 3 steps" train_run 1 runw
ini=$ini_i
W="$TESSERA infer $d/w.ini checkpoint=$d/runw input=$d/single/b.nii.gz"
# shellcheck disable=SC2086
ts_step "conv=direct on b, probabilities" ts_mpirun 1 $W output="$d/wd.nii.gz" probabilities="$d/wd_p.nii.gz" conv=direct
ts_check "the closing line says fp32 direct" sh -c 'printf "%s\n" "$1" | grep -qE "forwards of 1, fp32 direct,"' _ "$ts_out"
# shellcheck disable=SC2086
ts_step "the default (Winograd) on b, probabilities" ts_mpirun 1 $W output="$d/ww.nii.gz" probabilities="$d/ww_p.nii.gz"
ts_check "the closing line says fp32 winograd" sh -c 'printf "%s\n" "$1" | grep -qE "forwards of 1, fp32 winograd,"' _ "$ts_out"
ts_step "Winograd's probabilities within 1e-4 of the direct ones, not equal to them; masks agree on 99.9 % of the voxels" \
    close wd ww 1e-4 0.999
# shellcheck disable=SC2086
# bf16: Winograd with bf16 products where 64+ channels in and out (here the 32 -> 32 convolution)
# shellcheck disable=SC2086
ts_step "precision=bf16 conv=direct on b, probabilities" ts_mpirun 1 $W output="$d/wbd.nii.gz" probabilities="$d/wbd_p.nii.gz" \
    precision=bf16 conv=direct
ts_check "the closing line says bf16 direct" sh -c 'printf "%s\n" "$1" | grep -qE "forwards of 1, bf16 direct,"' _ "$ts_out"
# shellcheck disable=SC2086
ts_step "precision=bf16 conv=winograd, probabilities" ts_mpirun 1 $W output="$d/wbw.nii.gz" \
    probabilities="$d/wbw_p.nii.gz" precision=bf16 conv=winograd
ts_check "the closing line says bf16 winograd" sh -c 'printf "%s\n" "$1" | grep -qE "forwards of 1, bf16 winograd,"' _ "$ts_out"
ts_step "bf16 Winograd's probabilities within 0.02 of bf16 direct's, not equal to them (it ran); masks agree on 99 %" \
    close wbd wbw 0.02 0.99
ts_step "bf16 Winograd's probabilities within 0.02 of fp32 direct's; masks agree on 99 %" close wd wbw 0.02 0.99

# bad lists and options fail on every rank, before any prediction
mkdir -p "$d/lab2"
cp "$d/labels/a.nii.gz" "$d/lab2/"
ts_fails_on_all "a label folder without b's reference" "has no reference for $d/scans/b.nii.gz" 2 \
    infer 2 input="$d/scans" output="$d/e1" label="$d/lab2"
ts_fails_on_all "a missing label file, before any prediction" "label=$d/nothing.nii.gz: No such file" 2 \
    infer 2 input="$d/single/b.nii.gz" output="$d/e6.nii.gz" label="$d/nothing.nii.gz"
ts_fails_on_all "two inputs with one file name" "have the same file name" 2 \
    infer 2 input="$d/scans/a.nii.gz,$d/lab2/a.nii.gz" output="$d/e2"
ts_fails_on_all "output= the scans' own folder" "would overwrite the scans" 2 \
    infer 2 input="$d/scans" output="$d/scans"
ts_fails_on_all "several scans into one file" "names a NIfTI file, but input= names 3 scans" 2 \
    infer 2 input="$d/scans" output="$d/x.nii.gz"
ts_fails_on_all "decide= without labels" "needs label=" 2 infer 2 input="$d/scans" output="$d/e3" decide="$d/e3.json"
ts_fails_on_all "keep_largest=0" "class 0 is the background" 2 \
    infer 2 input="$d/single/b.nii.gz" output="$d/e4.nii.gz" keep_largest=0
ts_fails_on_all "mirror=xq" "mirror=xq: give axes x, y, z" 2 \
    infer 2 input="$d/single/b.nii.gz" output="$d/e5.nii.gz" mirror=xq
ts_fails_on_all "precision=fp8" "infer: precision=fp8: give fp32, bf16 or fp16" 2 \
    infer 2 input="$d/single/b.nii.gz" output="$d/e7.nii.gz" precision=fp8
ts_fails_on_all "batch=0" "infer: batch=0 must be 1..4096" 2 \
    infer 2 input="$d/single/b.nii.gz" output="$d/e8.nii.gz" batch=0
ts_fails_on_all "conv=fft" "infer: conv=fft: give winograd or direct" 2 \
    infer 2 input="$d/single/b.nii.gz" output="$d/e9.nii.gz" conv=fft
# train.engine: the forwards on the GPU where one is found (a real one, or the CUDA emulator of a build
# configured --with-cuda=emu), giving the CPU's mask and probabilities; without one, cuda is refused on every
# rank with the reason and auto predicts on the CPU without a word
if ts_mpirun 1 "$TESSERA" info 2>&1 | grep -q '^GPU 0:'; then
    for eng in cpu cuda; do
        ts_step "a GPU is visible: infer train.engine=$eng (TF32 off), 2 ranks" infer 2 input="$d/single/b.nii.gz" \
            output="$d/g-$eng.nii.gz" probabilities="$d/gp-$eng.nii.gz" train.engine=$eng train.tf32=false
    done
    ts_check "... the GPU run said so" sh -c "printf '%s\n' \"\$0\" | grep -q cudnn" "$ts_out"
    ts_step "... the GPU's mask and probabilities are the CPU's" ref near "$d/g-cpu.nii.gz" "$d/g-cuda.nii.gz" \
        "$d/gp-cpu.nii.gz" "$d/gp-cuda.nii.gz"
    ts_step "... on the GPU through 2 pipeline stages (parallel.pp = 2)" infer 2 input="$d/single/b.nii.gz" \
        output="$d/g-pp.nii.gz" probabilities="$d/gp-pp.nii.gz" train.engine=cuda train.tf32=false parallel.pp=2
    ts_step "... the CPU's mask and probabilities" ref near "$d/g-cpu.nii.gz" "$d/g-pp.nii.gz" \
        "$d/gp-cpu.nii.gz" "$d/gp-pp.nii.gz"
    ts_step "... on the GPU with each window split over 2 ranks (parallel.sp = 2)" infer 2 input="$d/single/b.nii.gz" \
        output="$d/g-sp.nii.gz" probabilities="$d/gp-sp.nii.gz" train.engine=cuda train.tf32=false parallel.sp=2
    ts_step "... the CPU's mask and probabilities" ref near "$d/g-cpu.nii.gz" "$d/g-sp.nii.gz" \
        "$d/gp-cpu.nii.gz" "$d/gp-sp.nii.gz"
else
    why=$(ts_mpirun 1 "$TESSERA" info 2>&1 | sed -n 's/^GPUs: *none found *//p' | head -1)
    ts_fails_on_all "train.engine=cuda without a GPU $why" "train.engine = cuda: " 2 \
        infer 2 input="$d/single/b.nii.gz" output="$d/e10.nii.gz" train.engine=cuda
    ts_step "train.engine=auto without a GPU: on the CPU" infer 1 input="$d/single/b.nii.gz" output="$d/ea.nii.gz" \
        train.engine=auto
    ts_check "... without a note, the mask of the CPU run" sh -c \
        "! printf '%s\n' \"\$0\" | grep -q 'train.engine' && cmp '$d/ea.nii.gz' '$d/b1.nii.gz'" "$ts_out"
fi
# a window forward that fails on one rank: every rank ends with an error before the probabilities' sums (no
# hang, nothing written), one stream and two
export TESSERA_FAULT=error:rank=1:at=window
ts_fails_on_all "a window forward failing on rank 1: every rank ends" "window forward failed" 2 \
    infer 2 input="$d/single/b.nii.gz" output="$d/e11.nii.gz"
export OMP_NUM_THREADS=2
ts_fails_on_all "... on 2 streams of rank 1" "window forward failed" 2 \
    infer 2 input="$d/single/b.nii.gz" output="$d/e11.nii.gz" batch=1 streams=2
export OMP_NUM_THREADS=1
unset TESSERA_FAULT
ts_check "nothing was written by the failing runs" [ ! -e "$d/e11.nii.gz" ]
ts_check "nothing was written by the failing runs" [ ! -e "$d/e1" -a ! -e "$d/e2" -a ! -e "$d/e4.nii.gz" -a ! -e "$d/e6.nii.gz" -a ! -e "$d/e7.nii.gz" -a ! -e "$d/e8.nii.gz" -a ! -e "$d/e9.nii.gz" -a ! -e "$d/e10.nii.gz" ]
ts_finish
