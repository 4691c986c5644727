#!/usr/bin/env python3
"""Every function of the installed headers says whether it is collective or
local (the rule of docs/library.md): the comment of the paragraph (the
lines between blank lines) that declares it names "collective" or "local",
or the header's opening comment says "every function is local". Arguments:
the installed headers (<tessera/NAME.h>); each names its source, which is
read. Prints TAP-free diagnostics and exits 1 on the first header missing
some."""
import re
import sys

bad = 0
total = 0
for inst in sys.argv[2:]:
    head = open(inst).read(300)
    m = re.search(r'generated from (\S+)', head)
    src = sys.argv[1] + '/' + m.group(1) if m else inst
    text = open(src).read()
    first = re.search(r'/\*.*?\*/', text, re.S)
    all_local = bool(first) and 'every function is local' in re.sub(r'\s+\*?\s*', ' ', first.group(0)).lower()
    for para in re.split(r'\n\s*\n', text):
        comments = ' '.join(re.findall(r'/\*.*?\*/', para, re.S)).lower()
        code = re.sub(r'/\*.*?\*/', '', para, flags=re.S)
        code = re.sub(r'^\s*#.*$', '', code, flags=re.M)
        code = re.sub(r'\{[^{}]*\}', ';', code)  # inline bodies (one level)
        for d in re.finditer(r'(?:^|;)\s*(?:extern\s+|static\s+inline\s+)?[A-Za-z_][\w \t\*]*?[\s\*](ts_\w+)\s*\(', code):
            total += 1
            if not all_local and not re.search(r'collective|local', comments):
                print(f'{src}: {d.group(1)}: no comment saying collective or local')
                bad += 1
print(f'{total} public functions, {bad} without collective/local')
sys.exit(1 if bad or total == 0 else 0)
