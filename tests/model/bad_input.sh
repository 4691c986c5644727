#!/bin/sh
# Bad input to the engine commands: each case must fail (non-zero exit) with
# a message naming the key, file or dataset at fault.
. "$TS_SRCDIR/tests/mpi/lib.sh"
G="$TS_SRCDIR/tests/golden"
T=$(mktemp -d) || exit 1
trap 'rm -rf "$T"' EXIT
n=0
fail=0
# expect_error DESCRIPTION PATTERN COMMAND...
expect_error() {
    desc=$1 pat=$2
    shift 2
    n=$((n + 1))
    if ts_mpirun 1 "$TS_BUILDDIR/tessera" "$@" > "$T/out" 2>&1 < /dev/null; then
        echo "not ok $n - $desc: succeeded"
        fail=1
    elif grep -q -- "$pat" "$T/out"; then
        echo "ok $n - $desc: $(grep 'error' "$T/out" | head -1 | cut -c1-220)"
    else
        echo "not ok $n - $desc: message lacks '$pat':"
        sed 's/^/# /' "$T/out"
        fail=1
    fi
}
cfg="$G/bn-sgd.ini"
run="model run $cfg weights=$G/bn-sgd-weights.h5 input=$G/input.h5 output=$T/y.h5"
expect_error "unknown config key" "unknown key 'model.chanels'" $run model.chanels=4,8
printf '[model]\nchannels = 4,8\nnorms = batch\n' > "$T/bad.ini"
expect_error "unknown key in a file names file and line" "bad.ini:3: unknown key 'model.norms'" model init "$T/bad.ini" --out "$T/w.h5"
expect_error "groups that do not divide the channels" "model.groups = 3" model init "$cfg" --out "$T/w.h5" model.norm=group model.groups=3
expect_error "patch not divisible by 2^(levels-1)" "data.patch" bench step "$cfg" data.patch=10 --steps 1
expect_error "bad value" "model.norm = 'layer'" model init "$cfg" --out "$T/w.h5" model.norm=layer
expect_error "class weights count" "train.class_weights" $run train.class_weights=1,2
# weights from another architecture
ts_mpirun 1 "$TS_BUILDDIR/tessera" model init "$cfg" --out "$T/w48.h5" model.channels=4,8 < /dev/null > /dev/null 2>&1
ts_mpirun 1 "$TS_BUILDDIR/tessera" model init "$cfg" --out "$T/w4816.h5" model.channels=4,12,16 < /dev/null > /dev/null 2>&1
ts_mpirun 1 "$TS_BUILDDIR/tessera" model init "$cfg" --out "$T/w.h5" < /dev/null > /dev/null 2>&1
ts_mpirun 1 "$TS_BUILDDIR/tessera" model init "$cfg" --out "$T/w1.h5" model.in_channels=1 < /dev/null > /dev/null 2>&1
ts_mpirun 1 "$TS_BUILDDIR/tessera" model init "$cfg" --out "$T/w8.h5" model.channels=4,8,16,32 data.patch=16 < /dev/null > /dev/null 2>&1
expect_error "missing parameter" "dataset /params/enc2.conv1.weight is missing" model run "$cfg" weights="$T/w48.h5" input="$G/input.h5" output="$T/y.h5"
expect_error "mis-shaped parameter" "dataset /params/enc1.conv1.weight has shape \[12, 4, 3, 3, 3\]" model run "$cfg" weights="$T/w4816.h5" input="$G/input.h5" output="$T/y.h5"
expect_error "buffer the model lacks" "is not a parameter of this model" model run "$cfg" weights="$T/w.h5" input="$G/input.h5" output="$T/y.h5" model.norm=group model.groups=2
expect_error "missing weights file" "nonexistent.h5: cannot open" model run "$cfg" weights="$T/nonexistent.h5" input="$G/input.h5" output="$T/y.h5"
expect_error "input channels" "/image has 2 channels" model run "$cfg" weights="$T/w1.h5" input="$G/input.h5" output="$T/y.h5" model.in_channels=1
expect_error "input size not divisible" "/image: size 8x12x16" model run "$cfg" weights="$T/w8.h5" input="$G/input.h5" output="$T/y.h5" model.channels=4,8,16,32 data.patch=16
if h5copy -i "$G/input.h5" -o "$T/nolabel.h5" -s /image -d /image 2> /dev/null; then
    expect_error "no /label for a train step" "needs /label" model run "$cfg" weights="$G/bn-sgd-weights.h5" input="$T/nolabel.h5" output="$T/z.h5" --train-step
fi
n=$((n + 1))
if ts_mpirun 2 "$TS_BUILDDIR/tessera" model init "$cfg" --out "$T/w2.h5" > "$T/out" 2>&1 < /dev/null; then
    echo "not ok $n - model init on 2 ranks: succeeded"
    fail=1
elif [ "$(grep -c 'runs on one rank' "$T/out")" -eq 2 ]; then
    echo "ok $n - model init on 2 ranks: both ranks fail with the same message"
else
    echo "not ok $n - model init on 2 ranks:"
    sed 's/^/# /' "$T/out"
    fail=1
fi
echo "1..$n"
exit $fail
