# Sourced by shell tests: TAP helpers. ok COND_STATUS "description"
. "$TS_SRCDIR/tests/mpi/lib.sh"
TESSERA="$TS_BUILDDIR/tessera"
tap_n=0
ok() { # ok STATUS DESCRIPTION
    tap_n=$((tap_n + 1))
    if [ "$1" -eq 0 ]; then echo "ok $tap_n - $2"; else echo "not ok $tap_n - $2"; fi
}
done_testing() { echo "1..$tap_n"; }
tmpdir=$(mktemp -d "${TMPDIR:-/tmp}/tessera-test.XXXXXX")
trap 'rm -rf "$tmpdir"' EXIT
