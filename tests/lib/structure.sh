#!/bin/sh
# The structure kept honest (issue [10], docs/architecture.md "Keeping the
# structure"): no function in src/, io/, collectives/ over 120 lines unless
# the line above it states why ("long-function: REASON"), and src/cli/ holds
# argument parsing and printing only (no file-format or numerical library,
# no file opened, no sorting, no MPI communication). The checker is
# tests/lib/structure.py; it is first shown to catch each kind of violation
# in a small tree of its own.
. "$TS_SRCDIR/tests/cli/tap.sh"
S="$TS_SRCDIR/tests/lib/structure.py"

# a tree with one long function (130 lines) and a src/cli file
mk() { # mk ROOT MARKER-LINE CLI-LINE
    mkdir -p "$1/src/cli" "$1/io" "$1/collectives"
    {
        echo '/* a long function */'
        if [ -n "$2" ]; then echo "$2"; fi
        echo 'static int long_one(int x)'
        echo '{'
        i=0
        while [ $i -lt 127 ]; do echo '    x++;'; i=$((i + 1)); done
        echo '    return x;'
        echo '}'
    } >"$1/src/long.c"
    printf '#include <stdio.h>\n%s\nint cmd(void)\n{\n    printf("%%d\\n", 1);\n    return 0;\n}\n' "$3" >"$1/src/cli/cmd.c"
}
t="$tmpdir/t"
mk "$t/a" "" ""
out=$(python3 "$S" funclen "$t/a")
[ $? -eq 1 ] && echo "$out" | grep -q 'src/long.c:2: long_one is 131 lines'
ok $? "the checker: a 131-line function without a reason fails, named with its file, line and length"
mk "$t/b" "/* long-function: one loop nest that shares its registers */" ""
python3 "$S" funclen "$t/b" >/dev/null
ok $? "the checker: the same function with a stated reason passes"
mk "$t/c" "/* long-function: */" ""
python3 "$S" funclen "$t/c" >/dev/null
[ $? -eq 1 ]
ok $? "the checker: a marker without a reason fails"
python3 "$S" cli "$t/a" >/dev/null
ok $? "the checker: a src/cli file that parses and prints passes"
n=0
for bad in '#include <hdf5.h>' 'static void f(void) { H5Fclose(0); }' 'static void f(double *v) { qsort(v, 2, 8, 0); }' \
    'static void f(void) { MPI_Allreduce(0, 0, 1, 0, 0, 0); }' 'static void f(void) { fopen("x", "w"); }' \
    'static double f(double x) { return sqrt(x); }' '#include <cjson/cJSON.h>'; do
    rm -rf "$t/d"
    mk "$t/d" "" "$bad"
    python3 "$S" cli "$t/d" >/dev/null && echo "# not caught: $bad" || n=$((n + 1))
done
[ $n -eq 7 ]
ok $? "the checker: each of 7 kinds of file-format, numerical or communication code in src/cli is caught ($n)"
rm -rf "$t/e"
mk "$t/e" "" 'static void f(void) { printf("sqrt(2) fopen(x) MPI_Allreduce("); }'
python3 "$S" cli "$t/e" >/dev/null
ok $? "the checker: names inside strings and comments are not code"

# the tree itself
out=$(python3 "$S" funclen "$TS_SRCDIR")
r=$?
ok $r "no function in src/, io/, collectives/ over 120 lines without a stated reason"
[ $r -eq 0 ] || echo "$out" | sed 's/^/# /'
n=$(grep -rn 'long-function:' "$TS_SRCDIR/src" "$TS_SRCDIR/io" "$TS_SRCDIR/collectives" --include='*.c' | wc -l)
echo "# $n function(s) over 120 lines with a stated reason"
out=$(python3 "$S" cli "$TS_SRCDIR")
r=$?
ok $r "src/cli/*.c: argument parsing and printing only"
[ $r -eq 0 ] || echo "$out" | sed 's/^/# /'
# every tracked script under jobs/ is named in an EXTRA_DIST (Makefile.am or a Makefile.mk),
# so the release tarball holds it (jobs/check.sh checks the whole tarball
# with make distdir; this catches the common case inside make check)
if git -C "$TS_SRCDIR" rev-parse --git-dir >/dev/null 2>&1; then
    miss=$(git -C "$TS_SRCDIR" ls-files jobs | grep -v '/Makefile.mk$' | while read -r f; do
        cat "$TS_SRCDIR/Makefile.am" $(git -C "$TS_SRCDIR" ls-files '*Makefile.mk' | sed "s|^|$TS_SRCDIR/|") |
            grep -q "$f" || echo "$f"; done)
    [ -z "$miss" ]
    ok $? "every tracked file under jobs/ is named in a Makefile's EXTRA_DIST"
    [ -z "$miss" ] || printf '# missing: %s\n' $miss
else
    echo "# skipped the jobs/ EXTRA_DIST check: $TS_SRCDIR is not a git checkout"
fi
done_testing
