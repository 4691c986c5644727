#!/bin/sh
# References stay inside the repository (issue [10], docs/architecture.md):
# every docs/<name>.md named in the code, the scripts, the build files or the
# documents exists; every Markdown link between documents resolves; no file
# names a document or folder outside the repository.
. "$TS_SRCDIR/tests/cli/tap.sh"
cd "$TS_SRCDIR" || exit 1
files=$(find . \( -name build -o -name 'build-*' -o -name runs -o -name .git -o -name 'tessera-*' -o -name autom4te.cache \) -prune \
    -o -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.py' -o -name '*.sh' -o -name '*.md' -o -name '*.mk' \
    -o -name '*.am' -o -name '*.ac' -o -name '*.ini' -o -name '*.in' -o -name '*.sbatch' -o -name '*.pbs' -o -name '*.txt' \) -print)
test -n "$files"
ok $? "source, script and document files found"

# docs/<name>.md anywhere
missing=$(grep -oh 'docs/[A-Za-z0-9_.-]*\.md' $files | sort -u | while read -r f; do [ -f "$f" ] || echo "$f"; done)
n=$(grep -oh 'docs/[A-Za-z0-9_.-]*\.md' $files | sort -u | wc -l)
[ -z "$missing" ]
ok $? "all $n distinct docs/*.md references resolve${missing:+; missing: $(echo $missing)}"
for f in $missing; do grep -ln "$f" $files | sed "s|^|# $f named in |"; done

# Markdown links [text](target.md#anchor) relative to the document
bad=""
for d in README.md docs/*.md; do
    for t in $(grep -o '](\([^)#:]*\.md\)' "$d" | sed 's/^](//'); do
        [ -f "$(dirname "$d")/$t" ] || bad="$bad $d->$t"
    done
done
[ -z "$bad" ]
ok $? "Markdown links between documents resolve${bad:+:$bad}"

# nothing outside the repository (the pattern is split so that this file does not match itself)
out=$(grep -nE 'DESIGN''\.md|STYLE''\.md|\.\./shared''/|/work''/|design'' doc' $files)
[ -z "$out" ]
ok $? "no reference to a document or folder outside the repository"
[ -z "$out" ] || echo "$out" | sed 's/^/# /'
done_testing
