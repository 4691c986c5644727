#!/bin/sh
# Writes the installed form of one public header. The module header beside
# its sources (e.g. collectives/coll.h) is the one source of truth; its
# installed copy <tessera/coll.h> differs only in that includes of other
# public headers ("src/core/config.h") become <tessera/config.h>, and that
# C++ compilers see C linkage. An include of a header that is not public is
# an error: the public API is closed under #include (docs/library.md).
#   sh include/public-header.sh SRCDIR HEADER OUT PUBLIC_HEADER...
set -e
srcdir=$1 src=$2 out=$3
shift 3
awk -v src="$src" -v pub="$*" '
BEGIN {
    n = split(pub, p, " ")
    for (i = 1; i <= n; i++) { b = p[i]; sub(/.*\//, "", b); flat[p[i]] = b }
    if (!(src in flat)) { printf "%s is not in TS_PUBLIC_HDRS\n", src > "/dev/stderr"; exit 1 }
    out[++no] = "/* <tessera/" flat[src] ">: generated from " src " (include/public-header.sh) when"
    out[++no] = " * tessera was built: edit that file, not this one. */"
}
{ line = $0 }
/^#[ \t]*include[ \t]*"/ {
    h = line; sub(/^#[ \t]*include[ \t]*"/, "", h); sub(/".*/, "", h)
    if (!(h in flat)) { printf "%s: includes \"%s\", which is not a public header (TS_PUBLIC_HDRS)\n", src, h > "/dev/stderr"; bad = 1 }
    line = "#include <tessera/" flat[h] ">"
}
{
    # C linkage opens before the first line of C after the include guard
    # (not around the includes: <mpi.h> may hold C++ code)
    t = line; sub(/^[ \t]+/, "", t)
    if (incomment) { if (index(t, "*/")) incomment = 0 }
    else if (substr(t, 1, 2) == "/*") { if (!index(substr(t, 3), "*/")) incomment = 1 }
    else if (guard == "" && t ~ /^#ifndef /) { guard = t; sub(/^#ifndef[ \t]+/, "", guard) }
    else if (guard != "" && !opened && t != "" && substr(t, 1, 1) != "#") {
        out[++no] = "#ifdef __cplusplus"; out[++no] = "extern \"C\" {"; out[++no] = "#endif"; opened = 1
    } else if (opened && t ~ /^#[ \t]*include/) {
        printf "%s: an #include after the first declaration (inside C linkage)\n", src > "/dev/stderr"; bad = 1
    }
    out[++no] = line
}
END {
    if (bad) exit 1
    while (no > 0 && out[no] == "") no--
    if (!opened || out[no] != "#endif") { printf "%s: expected an include guard closed by the last line (#endif)\n", src > "/dev/stderr"; exit 1 }
    for (i = 1; i < no; i++) print out[i]
    print "#ifdef __cplusplus"; print "}"; print "#endif"; print "#endif"
}' "$srcdir/$src" > "$out.tmp" || { rm -f "$out.tmp"; exit 1; }
mv -f "$out.tmp" "$out"
