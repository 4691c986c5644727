#!/bin/sh
# src/nn/conv_tiles.h and conv_tiles_bf16.h are generated (python3
# src/nn/gen_tiles.py [bf16] > ...): the committed header must be exactly what the
# generator writes, so that a hand edit, or a generator change without
# regenerating, fails here. The second check shows the comparison can fail.
. "$TS_SRCDIR/tests/cli/tap.sh"
python3 "$TS_SRCDIR/src/nn/gen_tiles.py" >"$tmpdir/conv_tiles.h"
ok $? "src/nn/gen_tiles.py runs"
test -s "$tmpdir/conv_tiles.h" && cmp -s "$tmpdir/conv_tiles.h" "$TS_SRCDIR/src/nn/conv_tiles.h"
r=$?
ok $r "src/nn/conv_tiles.h matches src/nn/gen_tiles.py (regenerate it with: python3 src/nn/gen_tiles.py > src/nn/conv_tiles.h)"
[ $r -eq 0 ] || diff "$tmpdir/conv_tiles.h" "$TS_SRCDIR/src/nn/conv_tiles.h" | head -20 | sed 's/^/# /'
python3 "$TS_SRCDIR/src/nn/gen_tiles.py" bf16 >"$tmpdir/conv_tiles_bf16.h"
test -s "$tmpdir/conv_tiles_bf16.h" && cmp -s "$tmpdir/conv_tiles_bf16.h" "$TS_SRCDIR/src/nn/conv_tiles_bf16.h"
r=$?
ok $r "src/nn/conv_tiles_bf16.h matches src/nn/gen_tiles.py bf16 (regenerate it with: python3 src/nn/gen_tiles.py bf16 > src/nn/conv_tiles_bf16.h)"
[ $r -eq 0 ] || diff "$tmpdir/conv_tiles_bf16.h" "$TS_SRCDIR/src/nn/conv_tiles_bf16.h" | head -20 | sed 's/^/# /'
# a hand edit (one changed line) is told apart
sed '5s/$/ /' "$TS_SRCDIR/src/nn/conv_tiles.h" >"$tmpdir/edited.h"
cmp -s "$tmpdir/conv_tiles.h" "$tmpdir/edited.h"
ok $([ $? -ne 0 ]; echo $?) "a header edited by hand (one line changed) does not match"
done_testing
