#!/bin/sh
# libtessera as a user gets it (issue [10], docs/library.md): the library
# installed into a prefix in the build tree (tests/lib/prefix, made by
# `make check` before the tests run), its headers flat under
# include/tessera/ with no path into the source tree, every public function
# saying collective or local, each header compiling alone (C and C++), and
# each example of examples/ built with only `pkg-config --cflags --libs
# tessera` (shared, soname libtessera.so.N) and with --static (libtessera.a),
# run on 1 and 2 ranks and checking its own result; train_loop's losses equal
# `tessera train`'s on its config.
. "$TS_SRCDIR/tests/cli/tap.sh"
export OMP_NUM_THREADS=1
unset TESSERA_FAULT TESSERA_RANKS_PER_NODE
P="$TS_PREFIX"
export PKG_CONFIG_PATH="$P/lib/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
: "${TS_CC:=mpicc.mpich}"

test -f "$P/include/tessera/tessera.h" && test -f "$P/lib/libtessera.a" && test -f "$P/lib/pkgconfig/tessera.pc"
ok $? "installed into $P: include/tessera/tessera.h, lib/libtessera.a, lib/pkgconfig/tessera.pc"
soname=$(readelf -d "$P/lib/libtessera.so" 2>/dev/null | sed -n 's/.*SONAME.*\[\(.*\)\].*/\1/p')
case "$soname" in libtessera.so.[0-9]*) test -f "$P/lib/$soname"; r=$? ;; *) r=1 ;; esac
ok $r "shared library with a versioned soname ($soname)"
ls "$P"/include/tessera/*/ >/dev/null 2>&1 && r=1 || r=0
ok $r "headers flat under include/tessera/ (no subfolders)"
bad=$(grep -l -E '^[[:space:]]*#[[:space:]]*include[[:space:]]*"|#[[:space:]]*include[[:space:]]*<(src|collectives|io)/' "$P"/include/tessera/*.h)
ok $([ -z "$bad" ]; echo $?) "no installed header includes a source-tree path ${bad:+(these do: $bad)}"
python3 "$TS_SRCDIR/tests/lib/api_doc.py" "$TS_SRCDIR" "$P"/include/tessera/*.h >"$tmpdir/api.txt"
ok $? "every public function's comment says collective or local: $(tail -1 "$tmpdir/api.txt")"
grep -v 'public functions' "$tmpdir/api.txt" | sed 's/^/# /'
cflags=$(pkg-config --cflags tessera) && libs=$(pkg-config --libs tessera) && slibs=$(pkg-config --static --libs tessera)
ok $? "pkg-config --cflags --libs [--static] tessera"
r=0
for h in "$P"/include/tessera/*.h; do
    printf '#include <tessera/%s>\n#include <tessera/%s>\nint main(void) { return 0; }\n' "${h##*/}" "${h##*/}" >"$tmpdir/h.c"
    $TS_CC -std=c99 -Wall -Werror -fsyntax-only $cflags "$tmpdir/h.c" || { echo "# $h does not compile alone (C)"; r=1; }
    if command -v mpicxx.mpich >/dev/null 2>&1; then
        cp "$tmpdir/h.c" "$tmpdir/h.cc"
        mpicxx.mpich -fsyntax-only $cflags "$tmpdir/h.cc" || { echo "# $h does not compile alone (C++)"; r=1; }
    fi
done
ok $r "each installed header compiles alone, twice included (C99 -Wall -Werror; C++ when mpicxx.mpich is there)"
printf '#include <tessera/tessera.h>\n#include <stdio.h>\n#if TESSERA_API_VERSION != TESSERA_MAKE_VERSION(TESSERA_VERSION_MAJOR, TESSERA_VERSION_MINOR, TESSERA_VERSION_PATCH)\n#error version\n#endif\nint main(void) { return ts_version() == TESSERA_API_VERSION ? 0 : 1; }\n' >"$tmpdir/v.c"
$TS_CC -o "$tmpdir/v" "$tmpdir/v.c" $cflags $libs -Wl,-rpath,"$P/lib" && "$tmpdir/v"
ok $? "TESSERA_API_VERSION at compile time equals ts_version() of the loaded library"
# docs/library.md's two ways to start a program linked to the shared library in a private prefix:
# without either the loader does not find libtessera.so.0 (shown first, unless the system has one)
$TS_CC -o "$tmpdir/v2" "$tmpdir/v.c" $cflags $libs
if env -u LD_LIBRARY_PATH "$tmpdir/v2" >/dev/null 2>&1; then
    echo "# a libtessera.so.0 on the loader's default path: the no-rpath case cannot be shown here"
    r=0
else
    LD_LIBRARY_PATH="$P/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmpdir/v2"
    r=$?
fi
ok $r "a program built without -Wl,-rpath does not start alone and starts with LD_LIBRARY_PATH=PREFIX/lib"

for src in $TS_EXAMPLES; do
    ex=$(basename "$src" .c)
    $TS_CC -std=gnu11 -Wall -Wextra -Werror -o "$tmpdir/$ex" "$TS_SRCDIR/$src" $cflags $libs -Wl,-rpath,"$P/lib"
    ok $? "$ex builds with \`pkg-config --cflags --libs tessera\`"
    readelf -d "$tmpdir/$ex" | grep -q "NEEDED.*\[$soname\]"
    ok $? "$ex is linked against $soname"
    # --static: the archive in place of -ltessera (what -Wl,-Bstatic would pick)
    $TS_CC -std=gnu11 -Wall -o "$tmpdir/$ex-static" "$TS_SRCDIR/$src" $(pkg-config --static --cflags tessera) \
        $(echo "$slibs" | sed "s|-ltessera\b|$P/lib/libtessera.a|")
    ok $? "$ex builds with \`pkg-config --static --cflags --libs tessera\` and libtessera.a"
    readelf -d "$tmpdir/$ex-static" | grep -q 'NEEDED.*libtessera'
    ok $([ $? -ne 0 ]; echo $?) "$ex-static needs no libtessera.so"
    for np in 1 2; do
        mkdir -p "$tmpdir/run-$ex-$np"
        (cd "$tmpdir/run-$ex-$np" && ts_mpirun $np "$tmpdir/$ex") >"$tmpdir/$ex-$np.out" 2>&1
        ok $? "$ex runs and checks itself on $np rank(s)"
        sed 's/^/#   /' "$tmpdir/$ex-$np.out" | tail -4
    done
    (cd "$tmpdir/run-$ex-2" && ts_mpirun 2 "$tmpdir/$ex-static") >"$tmpdir/$ex-static.out" 2>&1
    ok $? "$ex (static) runs and checks itself on 2 ranks"
done

# the custom loop and `tessera train` on the same config and seed: the same losses
"$tmpdir/train_loop" --print-config >"$tmpdir/loop.ini"
ts_mpirun 2 "$TS_BUILDDIR/tessera" train "$tmpdir/loop.ini" run.dir="$tmpdir/run" train.log_every=1 >"$tmpdir/train.out" 2>&1
ok $? "tessera train on train_loop's config (2 ranks)"
python3 - "$tmpdir/train_loop-2.out" "$tmpdir/run/metrics.jsonl" <<'PY'
import json, sys
loop = [float(l.split()[3]) for l in open(sys.argv[1]) if l.startswith('step ')]
train = [json.loads(l)['loss'] for l in open(sys.argv[2]) if '"dice"' not in l]
print('# train_loop:   ', ' '.join('%.6f' % x for x in loop))
print('# tessera train:', ' '.join('%.6f' % x for x in train))
ok = len(loop) == len(train) > 1 and all(abs(a - b) <= 1e-6 * abs(b) for a, b in zip(loop, train)) and loop[-1] < loop[0]
sys.exit(0 if ok else 1)
PY
ok $? "train_loop's losses per step equal tessera train's (relative 1e-6) and go down"
done_testing
