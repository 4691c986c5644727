/* Runs a fuzz target (tests/fuzz/fuzz_*.c) on committed inputs without
 * libFuzzer, so that `make check` replays the seed corpus and every crasher
 * ever found with the normal build (and its sanitizers under
 * --enable-sanitizers). Arguments: files or directories of inputs (read in
 * name order). TAP: one line per input; a crash or a failed property aborts
 * the program, which the TAP driver reports as a failure.
 *   replay_<target> DIR_OR_FILE... */
#include "tsbuild.h"
#include "tests/fuzz/fuzz_common.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void add(char ***list, int *n, int *cap, const char *p)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *list = realloc(*list, (size_t)*cap * sizeof **list);
        if (!*list) abort();
    }
    (*list)[(*n)++] = strdup(p);
}

int main(int argc, char **argv)
{
    char **files = NULL;
    int n = 0, cap = 0;
    for (int a = 1; a < argc; a++) {
        struct stat st;
        if (stat(argv[a], &st) != 0) continue; /* a target may have no regressions yet */
        if (!S_ISDIR(st.st_mode)) {
            add(&files, &n, &cap, argv[a]);
            continue;
        }
        DIR *d = opendir(argv[a]);
        struct dirent *e;
        int first = n;
        while (d && (e = readdir(d))) {
            if (e->d_name[0] == '.' || !strcmp(e->d_name, "README") || !strcmp(e->d_name, "README.md")) continue;
            char p[4096];
            snprintf(p, sizeof p, "%s/%s", argv[a], e->d_name);
            if (stat(p, &st) == 0 && S_ISREG(st.st_mode)) add(&files, &n, &cap, p);
        }
        if (d) closedir(d);
        if (n > first) qsort(files + first, (size_t)(n - first), sizeof *files, cmp_str); /* files is NULL while empty */
    }
    if (!n) {
        printf("1..0 # SKIP no inputs given\n");
        return 0;
    }
    int one = 1;
    char *args[] = {argv[0], NULL}, **av = args;
    LLVMFuzzerInitialize(&one, &av);
    printf("1..%d\n", n);
    fflush(stdout);
    for (int i = 0; i < n; i++) {
        FILE *f = fopen(files[i], "rb");
        if (!f) {
            printf("not ok %d - %s: cannot open\n", i + 1, files[i]);
            continue;
        }
        fseek(f, 0, SEEK_END);
        long len = ftell(f);
        fseek(f, 0, SEEK_SET);
        uint8_t *buf = malloc(len > 0 ? (size_t)len : 1);
        size_t got = buf ? fread(buf, 1, (size_t)(len > 0 ? len : 0), f) : 0;
        fclose(f);
        if (!buf || got != (size_t)(len > 0 ? len : 0)) {
            printf("not ok %d - %s: cannot read\n", i + 1, files[i]);
            free(buf);
            continue;
        }
        /* a crash ends the program here: the plan is then not met */
        fprintf(stderr, "replaying %s\n", files[i]);
        LLVMFuzzerTestOneInput(buf, got);
        printf("ok %d - %s (%zu bytes)\n", i + 1, files[i], got);
        fflush(stdout);
        free(buf);
        free(files[i]);
    }
    free(files);
    return 0;
}
