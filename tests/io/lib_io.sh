# Sourced by the io scenario tests (after tests/mpi/lib.sh): each step runs a
# command, shows its output as TAP diagnostics and prints one TAP line.
#   ts_step DESC CMD...     ok when CMD exits 0
#   ts_step_fails DESC CMD... ok when CMD exits non-zero (and does not time out)
#   ts_fails_on_all DESC TEXT NP CMD...  ok when CMD (a tessera run on NP ranks) exits
#                           non-zero and every rank printed "tessera: error (rank R): ...TEXT..."
#   ts_check DESC TEST...   ok when the shell test holds (e.g. ts_check "x" [ -f F ])
#   ts_skip DESC REASON
#   ts_finish               prints the plan, exits 1 if any step failed
# ts_out holds the last step's output. TS_PY is a Python 3 with h5py, nibabel
# and numpy (Debian's /usr/bin/python3 by default), or empty when none.
ts_n=0
ts_bad=0
ts_out=
TS_PY=${TS_PYTHON:-/usr/bin/python3}
if ! "$TS_PY" -c 'import h5py, nibabel, numpy' >/dev/null 2>&1; then TS_PY=; fi
ts_report() {
    ts_n=$((ts_n + 1))
    if [ "$1" = ok ]; then echo "ok $ts_n - $2"; else echo "not ok $ts_n - $2"; ts_bad=1; fi
}
ts_step() {
    _ts_d=$1; shift
    ts_out=$("$@" 2>&1); _ts_rc=$?
    [ -n "$ts_out" ] && printf '%s\n' "$ts_out" | sed 's/^/# /'
    if [ $_ts_rc -eq 0 ]; then ts_report ok "$_ts_d"; else ts_report bad "$_ts_d (exit $_ts_rc)"; fi
    return $_ts_rc
}
ts_step_fails() {
    _ts_d=$1; shift
    ts_out=$("$@" 2>&1); _ts_rc=$?
    [ -n "$ts_out" ] && printf '%s\n' "$ts_out" | sed 's/^/# /'
    if [ $_ts_rc -ne 0 ] && [ $_ts_rc -ne 124 ] && [ $_ts_rc -ne 137 ]; then ts_report ok "$_ts_d"; else ts_report bad "$_ts_d (exit $_ts_rc)"; fi
}
ts_fails_on_all() {
    _ts_d=$1; _ts_t=$2; _ts_np=$3; shift 3
    ts_out=$("$@" 2>&1); _ts_rc=$?
    [ -n "$ts_out" ] && printf '%s\n' "$ts_out" | sed 's/^/# /'
    _ts_ok=1
    if [ $_ts_rc -eq 0 ] || [ $_ts_rc -eq 124 ] || [ $_ts_rc -eq 137 ]; then _ts_ok=0; fi
    _ts_r=0
    while [ $_ts_r -lt "$_ts_np" ]; do
        printf '%s\n' "$ts_out" | grep -F "tessera: error (rank $_ts_r)" | grep -qF -- "$_ts_t" || _ts_ok=0
        _ts_r=$((_ts_r + 1))
    done
    if [ $_ts_ok -eq 1 ]; then ts_report ok "$_ts_d"; else ts_report bad "$_ts_d (exit $_ts_rc)"; fi
}
ts_check() {
    _ts_d=$1; shift
    if "$@"; then ts_report ok "$_ts_d"; else ts_report bad "$_ts_d"; fi
}
ts_skip() {
    ts_n=$((ts_n + 1))
    echo "ok $ts_n - $1 # SKIP $2"
}
ts_finish() {
    echo "1..$ts_n"
    exit $ts_bad
}
