#!/bin/sh
# The CUDA build's start-up (src/nn/cuda/cublas_lib.h): cuBLAS is not a
# link-time dependency, so a CPU run of a CUDA build does not load its 540 MB
# of libcublasLt (about 0.35 s before main()); the GPU engine opens it at its
# first use. Checks: the program needs no libcublas (readelf), tessera info
# opens it and prints its version, and with the library hidden (a file of
# no bytes bound over it in a mount namespace of its own; root) info says
# it could not be opened, naming the file, and still ends well. Builds
# without CUDA, or with the emulator, have no such library: skipped.
. "$TS_SRCDIR/tests/cli/tap.sh"
info=$(ts_mpirun 1 "$TESSERA" info 2>&1)
if ! printf '%s\n' "$info" | grep -q '^CUDA: *compiled'; then
    echo "1..0 # SKIP not a CUDA build linked against the toolkit ($(printf '%s\n' "$info" | grep '^CUDA:' | head -1))"
    exit 0
fi
needed=$(readelf -d "$TESSERA" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' | tr '\n' ' ')
echo "# needed: $needed"
case " $needed" in *" libcublas"*) r=1 ;; *) r=0 ;; esac
ok $r "tessera does not link cuBLAS (its libraries: $needed)"
case " $needed" in *" libcudnn"*) r=0 ;; *) r=1 ;; esac
ok $r "... and does link cuDNN (the readelf parse found the CUDA libraries)"
printf '%s\n' "$info" | grep '^CUDA:' | sed 's/^/# /'
printf '%s\n' "$info" | grep -qE 'cuBLAS [0-9]+\.[0-9]+\.[0-9]+'
ok $? "tessera info opens cuBLAS at its first use and prints its version"

# the file the loader would open: the program's run path, then the loader's cache
lib=""
for d in $(readelf -d "$TESSERA" | sed -n 's/.*(RUNPATH).*\[\(.*\)\]/\1/p' | tr ':' ' '); do
    for f in "$d"/libcublas.so.[0-9]*; do case "$f" in *.so.[0-9]*.*) ;; *) [ -e "$f" ] && lib=$f ;; esac; done
done
[ -n "$lib" ] || lib=$(ldconfig -p 2>/dev/null | sed -n 's/.*libcublas\.so\.[0-9]* .*=> //p' | head -1)
if [ "$(id -u)" -ne 0 ] || [ -z "$lib" ] || ! command -v unshare >/dev/null || ! unshare -m true 2>/dev/null; then
    echo "# skip: hiding cuBLAS needs root, unshare and the library's path (uid $(id -u), library '${lib}')"
else
    : >"$tmpdir/empty.so"
    unshare -m sh -c 'mount --bind "$1" "$2" && "$3" info' sh "$tmpdir/empty.so" "$lib" "$TESSERA" >"$tmpdir/hidden.txt" 2>&1
    rc=$?
    grep '^CUDA:' "$tmpdir/hidden.txt" | sed 's/^/# /'
    ok $rc "with $lib hidden, tessera info still ends well"
    grep -q "cuBLAS not loaded (cannot open libcublas.so.[0-9]*: .*$(basename "$lib")" "$tmpdir/hidden.txt"
    ok $? "... saying cuBLAS could not be opened, naming the file and the loader's reason"
fi
done_testing
