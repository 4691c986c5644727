#!/usr/bin/env python3
"""The structure rules of docs/architecture.md ("Keeping the structure"),
checked on a source tree:

  funclen ROOT [LIMIT]   every function in ROOT/src, ROOT/io, ROOT/collectives
                         (*.c) is at most LIMIT (default 120) lines, from its
                         first signature line to its closing brace, unless the
                         line just above the signature carries the marker
                         "long-function:" followed by a reason (at least three
                         words).
  cli ROOT               ROOT/src/cli/*.c hold argument parsing and printing
                         only: no file-format or numerical library (HDF5,
                         NIfTI, cJSON, inih, BLAS, OpenMP) is included or
                         called, no libm computation (sqrt, exp, log, pow,
                         rounding, ...; isfinite and fabs to check an argument
                         are parsing) is called, no file is opened, nothing is
                         sorted, and the only MPI calls are the process's life
                         cycle (init, rank, size, error handler, finalize,
                         abort), the library version for `tessera info`, and the
                         exit agreement of main.c.

Prints one line per violation ("FILE:LINE: ...") and exits 1 if there is
any, 0 otherwise. A function starts at a line that is exactly "{" (the
project's style, docs/architecture.md); its signature is the nearest line
above that starts with a letter; it ends at the next line starting with "}".
"""
import os
import re
import sys

MARKER = "long-function:"


def c_files(root, folders):
    for d in folders:
        for dp, dn, fs in os.walk(os.path.join(root, d)):
            dn.sort()
            for f in sorted(fs):
                if f.endswith(".c"):
                    yield os.path.join(dp, f)


def functions(lines):
    """(signature line index, end line index, name) of every function."""
    for i, l in enumerate(lines):
        if l.rstrip("\n") != "{":
            continue
        k = i - 1
        while k > 0 and not re.match(r"^[A-Za-z]", lines[k]):
            k -= 1
        m = re.search(r"([A-Za-z_0-9]+)\s*\(", lines[k])
        j = i + 1
        while j < len(lines) and not lines[j].startswith("}"):
            j += 1
        yield k, j, m.group(1) if m else lines[k].strip()


def has_reason(line):
    p = line.find(MARKER)
    if p < 0:
        return False
    reason = re.sub(r"\*/.*$", "", line[p + len(MARKER):]).strip()
    return len(reason.split()) >= 3


def funclen(root, limit):
    bad = []
    for p in c_files(root, ["src", "io", "collectives"]):
        lines = open(p, errors="replace").read().split("\n")
        for k, j, name in functions(lines):
            n = j - k + 1
            if n <= limit:
                continue
            if k > 0 and has_reason(lines[k - 1]):
                continue
            bad.append("%s:%d: %s is %d lines (limit %d; split it, or state the reason on the line above: "
                       "/* %s REASON */)" % (os.path.relpath(p, root), k + 1, name, n, limit, MARKER))
    return bad


def strip_comments_strings(text):
    """C text with comments and string/char literals blanked (line breaks kept)."""
    out, i, n = [], 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out.append(re.sub(r"[^\n]", " ", text[i:j]))
            i = j
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c:
                j += 2 if text[j] == "\\" else 1
            out.append(c + re.sub(r"[^\n]", " ", text[i + 1:j]) + c)
            i = j + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


# headers of the libraries that hold file formats and numerics
CLI_BANNED_INCLUDES = re.compile(r"#\s*include\s*<(hdf5[^>]*|H5[^>]*|nifti[^>]*|cjson/[^>]*|cJSON\.h|ini\.h|"
                                 r"cblas\.h|lapacke?\.h|omp\.h|complex\.h)>")
# calls into them, files opened directly, statistics
CLI_BANNED_CALLS = re.compile(r"\b(H5[A-Za-z_]*|nifti_\w+|cJSON_\w+|ini_parse\w*|cblas_\w+|omp_\w+|"
                              r"fopen|fdopen|freopen|open|fread|fwrite|qsort|bsearch|"
                              r"sqrtf?|expf?|exp2f?|logf?|log2f?|log10f?|powf?|cbrtf?|floorf?|ceilf?|roundf?|"
                              r"lroundf?|llroundf?|truncf?|fmodf?|sinf?|cosf?|tanhf?|erff?)\s*\(")
CLI_MPI_ALLOWED = {"MPI_Init_thread", "MPI_Init", "MPI_Finalize", "MPI_Comm_rank", "MPI_Comm_size",
                   "MPI_Comm_set_errhandler", "MPI_Abort", "MPI_Query_thread", "MPI_Get_library_version",
                   "MPI_Get_version"}
# main.c: every rank reports its exit status (a nonblocking agreement with a grace period)
CLI_MPI_ALLOWED_IN = {"main.c": {"MPI_Iallreduce", "MPI_Test"}}


def cli(root):
    bad = []
    for p in c_files(root, ["src/cli"]):
        base = os.path.basename(p)
        raw = open(p, errors="replace").read()
        for ln, l in enumerate(raw.split("\n"), 1):
            m = CLI_BANNED_INCLUDES.search(l)
            if m:
                bad.append("%s:%d: includes <%s> (file formats and numerics belong to the library)"
                           % (os.path.relpath(p, root), ln, m.group(1)))
        code = strip_comments_strings(raw)
        allowed = CLI_MPI_ALLOWED | CLI_MPI_ALLOWED_IN.get(base, set())
        for ln, l in enumerate(code.split("\n"), 1):
            for m in CLI_BANNED_CALLS.finditer(l):
                bad.append("%s:%d: calls %s (file formats and numerics belong to the library)"
                           % (os.path.relpath(p, root), ln, m.group(1)))
            for m in re.finditer(r"\b(MPI_[A-Z][a-z_]*)\s*\(", l):
                if m.group(1) not in allowed:
                    bad.append("%s:%d: calls %s (communication belongs to the library)"
                               % (os.path.relpath(p, root), ln, m.group(1)))
    return bad


def main(argv):
    if len(argv) < 3 or argv[1] not in ("funclen", "cli"):
        sys.stderr.write("usage: structure.py funclen ROOT [LIMIT] | cli ROOT\n")
        return 2
    bad = funclen(argv[2], int(argv[3]) if len(argv) > 3 else 120) if argv[1] == "funclen" else cli(argv[2])
    for b in bad:
        print(b)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
