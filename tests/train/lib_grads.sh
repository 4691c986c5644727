# The gradient-equivalence harness (docs/parallelism.md, "Equal to one
# rank"): one deterministic training step from saved initial weights, the
# gradients dumped (train.dump_grads) and compared tensor by tensor with one
# rank's (tests/train/grad_compare.py). Sourced by tests/train/lib_train.sh,
# with $d the test's directory (holding syn.h5), $ini the config and $TESSERA
# the program; needs $TS_PY (python3 with h5py).
#
#   grad_ref KEY ARGS...     initial weights ($d/init-KEY.h5, tessera model init)
#                            and the reference: one step on one rank with ARGS
#   grad_eq KEY NP BOUND ARGS...
#                            one step on NP ranks with KEY's ARGS then these
#                            (the layout), its gradients, buffers and loss
#                            within BOUND of the reference's, per tensor
#   grad_ne KEY NP ARGS...   the same, but the comparison must fail (a
#                            deliberately broken run: the harness catches it)
#   grads REF RUN [BOUND]    no run of its own: the dumps two training runs of
#                            the test wrote (lib_train.sh's run with
#                            dump_grads=yes: $d/g-REF.h5, $d/g-RUN.h5) from the
#                            same weights, RUN's within BOUND (default
#                            $grad_bound, else 1e-4; 0: bit-identical) of REF's.
#                            The equivalence tests compare the runs they train
#                            anyway, so the check costs no run

_grad_run() { # NP NAME ARGS...: one step into $d/g-NAME.h5, quiet unless it fails
    _gn=$1 _gname=$2
    shift 2
    ts_mpirun "$_gn" "$TESSERA" train "$ini" data.path="$d/syn.h5" run.dir="$d/r-$_gname" \
        train.dump_grads="$d/g-$_gname.h5" train.steps=1 "$@" >"$d/r-$_gname.log" 2>&1 ||
        { tail -n 20 "$d/r-$_gname.log"; return 1; }
}

grad_ref() {
    _gk=$1
    shift
    echo "$*" >"$d/args-$_gk"
    ts_step "reference $_gk: initial weights, one step on one rank ($*)" sh -c \
        "\"\$0\" model init \"\$1\" $* --out \"\$2\" --seed 3 >/dev/null" "$TESSERA" "$ini" "$d/init-$_gk.h5" &&
        _grad_run 1 "ref-$_gk" $* model.init="$d/init-$_gk.h5"
}

# _grad_case KEY NP BOUND EXPECT ARGS... (EXPECT: same | differ)
_grad_case() {
    _gk=$1 _gn=$2 _gb=$3 _ge=$4
    shift 4
    _gi=$((${_gi:-0} + 1))
    _gname="$_gk-$_gi"
    _gdesc="$_gk on $_gn ranks ($*)"
    if [ ! -f "$d/g-ref-$_gk.h5" ]; then
        ts_report bad "$_gdesc: no reference (its run failed above)"
        return 1
    fi
    _grad_run "$_gn" "$_gname" $(cat "$d/args-$_gk") model.init="$d/init-$_gk.h5" "$@"
    _grc=$?
    if [ $_grc -ne 0 ]; then
        ts_report bad "$_gdesc: the run failed"
        return 1
    fi
    _grad_cmp "$d/g-ref-$_gk.h5" "$d/g-$_gname.h5" "$_gb" "$_ge" "$_gdesc" "one rank's"
    rm -rf "$d/r-$_gname" "$d/g-$_gname.h5"
}

# _grad_cmp REF.h5 RUN.h5 BOUND EXPECT DESC WHOSE: grad_compare.py, one TAP line
_grad_cmp() {
    ts_out=$("$TS_PY" "$TS_SRCDIR/tests/train/grad_compare.py" "$1" "$2" "$3" 2>&1)
    _grc=$?
    printf '%s\n' "$ts_out" | sed 's/^/# /'
    if [ "$4" = same ]; then
        if [ $_grc -eq 0 ] && [ "$3" = 0 ]; then ts_report ok "$5: every gradient bit-identical to $6"
        elif [ $_grc -eq 0 ]; then ts_report ok "$5: every gradient within $3 of $6"
        else ts_report bad "$5: gradients differ from $6"; fi
    else
        if [ $_grc -eq 1 ] && printf '%s\n' "$ts_out" | grep -q '^not ok: '; then
            ts_report ok "$5: the harness catches it (gradients beyond $3)"
        else ts_report bad "$5: the harness did not catch it"; fi
    fi
}
grad_eq() {
    _gek=$1 _gen=$2 _geb=$3
    shift 3
    _grad_case "$_gek" "$_gen" "$_geb" same "$@"
}
grad_ne() {
    _gek=$1 _gen=$2
    shift 2
    _grad_case "$_gek" "$_gen" 1e-4 differ "$@"
}
grads() {
    _gb=${3:-${grad_bound:-1e-4}}
    if [ -z "$TS_PY" ]; then
        ts_skip "$2 = $1: the first step's gradients" "no python3 with h5py"
        return 0
    fi
    if [ ! -f "$d/g-$1.h5" ] || [ ! -f "$d/g-$2.h5" ]; then
        ts_report bad "$2 = $1: the first step's gradients: no dump (a run failed above, or ran without dump_grads=yes)"
        return 1
    fi
    _grad_cmp "$d/g-$1.h5" "$d/g-$2.h5" "$_gb" same "$2 = $1, the first step's gradients per tensor" "$1's"
}
