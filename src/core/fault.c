/* Fault injection; see fault.h. Owns the TESSERA_FAULT table (parsed by
 * ts_fault_init) and the current step; code under test asks ts_fault_at or
 * ts_fault_point. No MPI; the only output is an injected kill's or hang's
 * note on stderr. */
#include "tsbuild.h"
#include "src/core/fault.h"
#include "src/core/error.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_FAULTS 16

typedef struct {
    ts_fault_kind kind;
    int64_t step; /* -1: any */
    int from;     /* step=N+: N and every step after */
    char op[64];  /* hang only; "" any */
} fault;

static fault faults[MAX_FAULTS];
static int nfaults;
static volatile int64_t cur_step;

static const char *const kind_names[TS_FAULT_KINDS] = {"kill", "hang", "nan", "error", "enospc", "corrupt", "overflow", "mpierr",
                                                               "nccl"};

int ts_fault_init(int world_rank)
{
    nfaults = 0;
    const char *env = getenv("TESSERA_FAULT");
    if (!env || !*env) return 0;
    char buf[1024];
    if (strlen(env) >= sizeof buf) return TS_ERR(TS_ERR_CONFIG, "TESSERA_FAULT is longer than %zu characters", sizeof buf - 1);
    snprintf(buf, sizeof buf, "%s", env);
    char *save = NULL;
    for (char *e = strtok_r(buf, ";", &save); e; e = strtok_r(NULL, ";", &save)) {
        char entry[256], *s2 = NULL;
        snprintf(entry, sizeof entry, "%s", e);
        char *tok = strtok_r(entry, ":", &s2);
        if (!tok) continue;
        int k = -1;
        for (int i = 0; i < TS_FAULT_KINDS; i++)
            if (!strcmp(tok, kind_names[i])) k = i;
        if (k < 0)
            return TS_ERR(TS_ERR_CONFIG, "TESSERA_FAULT entry '%s': unknown kind '%s' (kill, hang, nan, error, enospc, corrupt, overflow, mpierr, nccl)",
                          e, tok);
        fault f = {(ts_fault_kind)k, -1, 0, ""};
        int rank = -1;
        for (tok = strtok_r(NULL, ":", &s2); tok; tok = strtok_r(NULL, ":", &s2)) {
            char *end;
            if (!strncmp(tok, "rank=", 5)) {
                rank = (int)strtol(tok + 5, &end, 10);
                if (*end || rank < 0) return TS_ERR(TS_ERR_CONFIG, "TESSERA_FAULT entry '%s': bad %s", e, tok);
            } else if (!strncmp(tok, "step=", 5)) {
                f.step = strtoll(tok + 5, &end, 10);
                if (*end == '+') {
                    f.from = 1;
                    end++;
                }
                if (*end || f.step < 1) return TS_ERR(TS_ERR_CONFIG, "TESSERA_FAULT entry '%s': bad %s", e, tok);
            } else if (!strncmp(tok, "op=", 3) && k == TS_FAULT_HANG) {
                snprintf(f.op, sizeof f.op, "%s", tok + 3);
            } else if (!strcmp(tok, "at=window") && k == TS_FAULT_ERROR) {
                snprintf(f.op, sizeof f.op, "window"); /* a window's forward in evaluation or inference */
            } else if (!strncmp(tok, "at=", 3) && k == TS_FAULT_KILL) {
                static const char *const points[] = {"forward", "backward", "reduce", "update", "ckpt"};
                int known = 0;
                for (size_t q = 0; q < sizeof points / sizeof *points; q++) known |= !strcmp(tok + 3, points[q]);
                if (!known)
                    return TS_ERR(TS_ERR_CONFIG, "TESSERA_FAULT entry '%s': unknown kill point '%s' (forward, backward, reduce, "
                                  "update, ckpt)", e, tok + 3);
                snprintf(f.op, sizeof f.op, "%s", tok + 3);
            } else if (!strcmp(tok, "ckpt") && (k == TS_FAULT_ENOSPC || k == TS_FAULT_CORRUPT)) {
                /* the only target of these */
            } else {
                return TS_ERR(TS_ERR_CONFIG, "TESSERA_FAULT entry '%s': unknown option '%s'", e, tok);
            }
        }
        if (rank >= 0 && rank != world_rank) continue;
        if (nfaults == MAX_FAULTS) return TS_ERR(TS_ERR_CONFIG, "TESSERA_FAULT: more than %d faults", MAX_FAULTS);
        faults[nfaults++] = f;
    }
    return 0;
}

int ts_fault_any(void) { return nfaults > 0; }
void ts_fault_set_step(int64_t step) { cur_step = step; }
int64_t ts_fault_step(void) { return cur_step; }

int ts_fault_at(ts_fault_kind k, int64_t step, const char *op)
{
    for (int i = 0; i < nfaults; i++) {
        const fault *f = &faults[i];
        if (f->kind != k || (f->step >= 0 && (f->from ? step < f->step : f->step != step))) continue;
        if (k == TS_FAULT_HANG && f->op[0] && op && strcmp(f->op, op)) continue;
        if (k == TS_FAULT_KILL && f->op[0] && (!op || strcmp(f->op, op))) continue; /* a kill at= fires only there */
        if (k == TS_FAULT_ERROR && (f->op[0] ? !op || strcmp(f->op, op) : op != NULL))
            continue; /* an error at=window only in a window's forward, the others only in a step's */
        return 1;
    }
    return 0;
}

void ts_fault_point(const char *op)
{
    if (!nfaults) return;
    if (ts_fault_at(TS_FAULT_KILL, cur_step, op)) {
        fprintf(stderr, "tessera: fault injected: SIGKILL at step %lld%s%s\n", (long long)cur_step, op ? " in " : "", op ? op : "");
        fflush(stderr);
        raise(SIGKILL);
    }
    if (op && ts_fault_at(TS_FAULT_HANG, cur_step, op)) {
        fprintf(stderr, "tessera: fault injected: hanging in %s at step %lld\n", op, (long long)cur_step);
        fflush(stderr);
        for (;;) pause(); /* as a rank that never arrives */
    }
}
