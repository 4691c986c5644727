/* The collectives' cost model: α-β models of the algorithms, fitted to
 * what `tessera bench coll --tune` measured and used by `tessera plan` to
 * predict collectives at sizes and rank counts not measured. Each
 * algorithm's time is
 *   T(p, n) = L(p)·α + B(p)·n·β
 * with L(p) its latency terms and B(p) its bytes per byte of message, as
 * the cost comment at the top of its file states (ring: L = 2(p-1),
 * B = 2(p-1)/p; recursive doubling: L = B = ⌈log2 p⌉; ...); β lumps the
 * transfer (β) and reduction (γ) costs per byte, since one rank count
 * cannot tell them apart. The fits live in the tuning table's "models"
 * array (docs/formats.md). */
#ifndef TS_COLLECTIVES_COST_MODEL_H
#define TS_COLLECTIVES_COST_MODEL_H

#include <stddef.h>

typedef struct ts_coll_fit {
    char op[24], algo[32];
    int ranks, nodes;        /* where it was measured */
    double alpha_s;          /* seconds per latency term */
    double beta_s;           /* seconds per byte of B(p)·n */
    double max_rel_err;      /* median |fit - measured| / measured over the sizes (name kept for the file) */
    double min_bytes, max_bytes; /* the measured range */
} ts_coll_fit;

/* Local. The latency terms L(p) and bytes factor B(p) of op/algo at p
 * ranks (unknown algorithms: MPI's likely choice, 2·log2 p and 2(p-1)/p
 * for allreduce). */
void ts_coll_model_shape(const char *op, const char *algo, int p, double *L, double *B);
/* Local. Fits α and β (>= 0) to k measured times t[i] at bytes[i]: the
 * latency from the three smallest sizes, the per-byte cost from sizes of
 * 1 MiB and more (medians: one noisy size does not move the fit). Errors:
 * k < 2 or p < 2 (TS_ERR_ARG). */
int ts_coll_model_fit(const char *op, const char *algo, int p, int nodes, const double *bytes, const double *t, int k,
                      ts_coll_fit *out);
/* Local. Predicted seconds of f's algorithm at p ranks (p = 1: 0). */
double ts_coll_model_time(const ts_coll_fit *f, int p, double bytes);
/* Local. Merges fits into the tuning table at path (replacing fits of the
 * same op, algo, ranks and nodes; the file's entries are kept). */
int ts_coll_model_write(const char *path, const ts_coll_fit *fits, int n);
/* Local. The fits of a tuning table (*fits malloc'ed, *n may be 0 when the
 * table has none). Errors: unreadable file or bad JSON. */
int ts_coll_model_load(const char *path, ts_coll_fit **fits, int *n);
/* Local. The fastest prediction among fits of op measured on `nodes`
 * nodes, at p ranks and n bytes (fits from the rank count nearest p);
 * *algo (may be NULL) names it. Returns -1 when no fit applies. */
double ts_coll_model_best(const ts_coll_fit *fits, int nfits, const char *op, int nodes, int p, double bytes,
                          const char **algo);

#endif
