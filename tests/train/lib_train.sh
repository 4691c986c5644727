# What the training tests share (tests/train/*.sh,
# tests/parallel/spatial_variants.sh). Sourced first, instead of
# tests/mpi/lib.sh and tests/io/lib_io.sh (it sources both, and
# tests/train/lib_grads.sh):
#
#   . "$TS_SRCDIR/tests/train/lib_train.sh"
#
# It sets $TESSERA (the program), exports OMP_NUM_THREADS=1 and
# TESSERA_EXIT_GRACE=20 (a rank whose peers do not finish gives up after
# 20 s instead of 30), and unsets what would change a run behind the test's
# back (TESSERA_FAULT, TESSERA_RANKS_PER_NODE, TESSERA_COLL_ALLREDUCE).
#
#   ts_tmpdir NAME           $d: a new directory ${TMPDIR:-/tmp}/tessera-NAME.XXXXXX,
#                            removed at exit
#   ts_synth COUNT SIZE SEED [NP]
#                            one step: $d/syn.h5, COUNT synthetic samples of
#                            SIZE^3 and 3 classes (tessera synth on NP ranks, 2
#                            unless given)
#   ts_ini FILE [CHANGE...]  writes the common config (below) to $d/FILE with the
#                            changes and sets $ini to it and $ini_steps to its
#                            train.steps; a CHANGE is section.key=value (set, or
#                            add) or -section.key (remove; a section left empty
#                            is dropped)
#   train_run NP NAME ARGS...
#                            tessera train $ini on $d/syn.h5 on NP ranks into
#                            $d/NAME, ARGS last (they override); with
#                            dump_grads=yes also train.dump_grads=$d/g-NAME.h5
#                            (the first step's gradients; compared by `grads`)
#   run NP NAME ARGS...      train_run as one ts_step ("NAME: NP rank(s) ARGS")
#   same REF RUN [init=FILE] [steps=N] [loss=RTOL] [weights=TOL]
#                            one step: RUN's loss at every step within RTOL
#                            relative of REF's, its weights after step N within
#                            TOL of their scale, and they moved from $d/FILE
#                            (tests/train/compare_runs.py; 0 0: bit-identical).
#                            Defaults: $same_init (init.h5), $ini_steps,
#                            $same_loss (1e-5), $same_weights (1e-4)
#   grads REF RUN [BOUND]    one step: RUN's first-step gradients, buffers and
#                            loss within BOUND of REF's, tensor by tensor
#                            (lib_grads.sh; default $grad_bound, 1e-4); both
#                            runs made with dump_grads=yes from the same weights
#
# The common config: a 3-level UNet3D with group norm, 16^3 patches, batch 2,
# 6 SGD steps with momentum, deterministic reductions, every step logged, no
# final evaluation.
. "$TS_SRCDIR/tests/mpi/lib.sh"
. "$TS_SRCDIR/tests/io/lib_io.sh"
TESSERA="$TS_BUILDDIR/tessera"
export OMP_NUM_THREADS=1 TESSERA_EXIT_GRACE=20
unset TESSERA_FAULT TESSERA_RANKS_PER_NODE TESSERA_COLL_ALLREDUCE

ts_tmpdir() {
    d=$(mktemp -d "${TMPDIR:-/tmp}/tessera-$1.XXXXXX") || exit 1
    trap 'rm -rf "$d"' EXIT
}

# ts_gpu_or_finish WHAT: the GPU tests' preamble (after ts_tmpdir): skips WHAT and finishes the test where no
# GPU is visible (the caller's CUDA_VISIBLE_DEVICES, ts_use_gpus) or no python3 with h5py is there
ts_gpu_or_finish() {
    ts_use_gpus
    if ! ts_mpirun 1 "$TESSERA" info 2>&1 | grep -q '^GPU 0:'; then
        ts_skip "$1" "no GPU is visible here (a build with CUDA on a GPU machine, or one configured --with-cuda=emu, runs it)"
        ts_finish
    fi
    if [ -z "$TS_PY" ]; then
        ts_skip "$1" "no python3 with h5py"
        ts_finish
    fi
}

ts_synth() {
    ts_step "synthetic dataset: $1 samples of $2^3, 3 classes" \
        ts_mpirun "${4:-2}" "$TESSERA" synth --out "$d/syn.h5" --count "$1" --size "$2" --classes 3 --seed "$3"
}

ts_ini_base='[model]
channels = 4,8,16
classes = 3
norm = group
groups = 2
[data]
patch = 16
[train]
batch = 2
steps = 6
lr = 0.05
momentum = 0.9
loss = ce+dice
deterministic = true
log_every = 1
[eval]
final = false
'
ts_ini() {
    ini=$d/$1
    shift
    printf '%s\n' "$@" >"$ini.changes"
    printf '%s' "$ts_ini_base" | awk '
        FNR == NR {
            if ($0 == "") next
            if (substr($0, 1, 1) == "-") { k = substr($0, 2); del[k] = 1; want[k] = 1; next }
            e = index($0, "=")
            if (e < 2) {
                print "Bail out! ts_ini: a change is section.key=value or -section.key: " $0 > "/dev/stderr"
                bad = 1
                next
            }
            k = substr($0, 1, e - 1); val[k] = substr($0, e + 1); keys[++nk] = k
            next
        }
        function flush(s,    i, k, p) { # the section s: its header (if anything is in it) and its lines
            if (s == "") return
            for (i = 1; i <= nk; i++) {
                k = keys[i]; p = index(k, ".")
                if (substr(k, 1, p - 1) == s && !(k in used)) {
                    line[++nl] = substr(k, p + 1) " = " val[k]
                    used[k] = 1
                }
            }
            if (nl) print "[" s "]"
            for (i = 1; i <= nl; i++) print line[i]
            nl = 0; seen[s] = 1
        }
        /^\[/ { flush(sec); sec = substr($0, 2, length($0) - 2); next }
        {
            e = index($0, " = "); k = sec "." substr($0, 1, e - 1)
            if (k in del) { gone[k] = 1; next }
            if (k in val) { line[++nl] = substr($0, 1, e - 1) " = " val[k]; used[k] = 1; next }
            line[++nl] = $0
        }
        END {
            flush(sec)
            for (i = 1; i <= nk; i++) { # sections the common config does not have
                k = keys[i]; s = substr(k, 1, index(k, ".") - 1)
                if (!(s in seen)) flush(s)
            }
            for (k in want)
                if (!(k in gone)) {
                    print "Bail out! ts_ini: -" k ": no such key in the common config" > "/dev/stderr"
                    bad = 1
                }
            exit bad
        }' "$ini.changes" - >"$ini" || exit 1
    rm -f "$ini.changes"
    ini_steps=$(awk '/^\[/ { s = $0 } s == "[train]" && $1 == "steps" { print $3 }' "$ini")
}

train_run() {
    _np=$1 _name=$2
    shift 2
    if [ "${dump_grads:-}" = yes ]; then
        set -- train.dump_grads="$d/g-$_name.h5" "$@"
    fi
    ts_mpirun "$_np" "$TESSERA" train "$ini" data.path="$d/syn.h5" run.dir="$d/$_name" "$@"
}

run() {
    _rdesc="$2: $1 rank(s) $(shift 2; echo "$*")"
    ts_step "$_rdesc" train_run "$@"
}

same() {
    _sr=$1 _sn=$2
    shift 2
    _si=${same_init:-init.h5} _ss=${same_steps:-$ini_steps} _sl=${same_loss:-1e-5} _sw=${same_weights:-1e-4}
    for _sa; do
        case $_sa in
        init=*) _si=${_sa#init=} ;;
        steps=*) _ss=${_sa#steps=} ;;
        loss=*) _sl=${_sa#loss=} ;;
        weights=*) _sw=${_sa#weights=} ;;
        *) echo "same: unknown option $_sa" >&2; exit 1 ;;
        esac
    done
    if [ "$_sl" = 0 ] && [ "$_sw" = 0 ]; then
        _sd="losses and weights bit-identical"
    else
        _sd="losses at every step within $_sl, weights within $_sw of their scale"
    fi
    if [ -n "$TS_PY" ]; then
        ts_step "$_sn = $_sr: $_sd after $_ss steps (and they moved)" \
            "$TS_PY" "$TS_SRCDIR/tests/train/compare_runs.py" "$d/$_sr" "$d/$_sn" "$d/$_si" "$_ss" "$_sl" "$_sw"
    else
        ts_skip "$_sn = $_sr" "no python3 with h5py"
    fi
}

. "$TS_SRCDIR/tests/train/lib_grads.sh"
