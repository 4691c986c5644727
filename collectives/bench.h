/* The collective benchmark behind `tessera bench coll`: times collectives
 * over a range of sizes for several algorithms in one run (interleaved
 * repetitions, medians, so ratios are fair on a noisy machine), reports time,
 * algbw and busbw (nccl-tests formulas), counts wrong elements against
 * exactly known results (check), and writes the fastest algorithm per size
 * as a tuning table with the α-β fit of each algorithm (collectives/cost_model.h).
 *
 *   ts_coll_bench_opts o;  ts_coll_bench_opts_default(&o);  (set fields)
 *   ts_coll_bench *b;  ts_coll_bench_create(comm, &o, &b);     // collective
 *   for (si = 0; si < b->nsize; si++) ts_coll_bench_size(b, si); // collective; rows in b->rows
 *   ts_coll_bench_finish(b, json, tune);                        // collective
 *   ts_coll_bench_wrong(b);  ts_coll_bench_destroy(&b);
 *
 * Internal to the library (not installed); the command prints. */
#ifndef TS_COLLECTIVES_BENCH_H
#define TS_COLLECTIVES_BENCH_H

#include <mpi.h>
#include <stddef.h>

#include "collectives/coll.h"
#include "collectives/cost_model.h"

#define TS_COLL_BENCH_MAX_ALGOS 16
#define TS_COLL_BENCH_MAX_SIZES 64

typedef struct ts_coll_bench_opts {
    ts_coll_kind kind;
    ts_dtype dt;
    ts_op op;
    size_t min_bytes, max_bytes; /* sizes: min, x4 steps, max (at most TS_COLL_BENCH_MAX_SIZES) */
    const char *algos[TS_COLL_BENCH_MAX_ALGOS]; /* borrowed names ("auto" allowed); nalgo = 0: every
                                                   registered algorithm that can run here, then auto */
    int nalgo;
    int check;      /* fill inputs with exactly known results and count wrong elements */
    int in_place;   /* sendbuf = TS_IN_PLACE */
    int registered; /* the buffer in a registered shared window (implies in_place) */
    int device;     /* GPU buffers */
    int repeat;     /* interleaved repetitions (median) */
    int root;       /* bcast root */
    double target_s; /* timed calls per repetition: about this long */
} ts_coll_bench_opts;

/* one measured (size, algorithm) */
typedef struct ts_coll_bench_row {
    size_t bytes;
    const char *algo;       /* points into opts.algos */
    double time_s;          /* median over repetitions of the slowest rank's mean call time */
    double algbw_GBps, busbw_GBps;
    size_t wrong;           /* over all ranks; 0 without check */
    double vs_mpi;          /* time of "mpi" / this time; < 0 when "mpi" was not run */
    char chosen[32];        /* for "auto": the algorithm it chose, else "" */
    char why[32];           /* and why ("tuning", "rule", "forced") */
} ts_coll_bench_row;

typedef struct ts_coll_bench {
    ts_coll_bench_opts o;   /* as resolved: the algorithm list that runs */
    int ranks, nodes, local_size, equal_nodes;
    int nskipped;           /* default list only: algorithms that cannot run here, and why */
    const char *skipped[TS_COLL_BENCH_MAX_ALGOS];
    char skip_why[TS_COLL_BENCH_MAX_ALGOS][256];
    int nsize;
    size_t sizes[TS_COLL_BENCH_MAX_SIZES];
    int done;               /* sizes measured so far */
    ts_coll_bench_row rows[TS_COLL_BENCH_MAX_SIZES][TS_COLL_BENCH_MAX_ALGOS]; /* [size][algo] */
    ts_coll_fit fits[TS_COLL_BENCH_MAX_ALGOS]; /* after finish with a tuning file: the α-β models written */
    int nfits;
    /* private */
    MPI_Comm comm;
    ts_coll *c;
    void *sbuf, *rbuf, *hbuf;
    double *samples;
} ts_coll_bench;

/* Local. Defaults: allreduce, float32, sum, 8 B .. 64 MiB, every algorithm,
 * out of place, 5 repetitions of about 30 ms. */
void ts_coll_bench_opts_default(ts_coll_bench_opts *o);

/* Collective on comm (duplicated). Checks o (sizes, root,
 * algorithm names), resolves the algorithm list, the sizes, and allocates the
 * buffers after checking that they fit in the node's memory. Errors are
 * agreed: every rank returns the same code, *out NULL. o->algos are
 * borrowed for the life of *out. */
int ts_coll_bench_create(MPI_Comm comm, const ts_coll_bench_opts *o, ts_coll_bench **out);
/* Collective. Measures size index si (0..nsize-1, in order): with check a
 * correctness run per algorithm first, then the interleaved repetitions;
 * fills b->rows[si]. Errors agreed. */
int ts_coll_bench_size(ts_coll_bench *b, int si);
/* Collective. After all sizes: rank 0 writes the rows as JSON to json and
 * the tuning table with the α-β fits to tune (either may be NULL); b->fits
 * holds the fits written (rank 0). Errors agreed. */
int ts_coll_bench_finish(ts_coll_bench *b, const char *json, const char *tune);
/* Local. With check: TS_ERR_INTERNAL naming the first row with wrong
 * elements; else 0. The same on every rank (wrong counts are global). */
int ts_coll_bench_wrong(const ts_coll_bench *b);
/* Collective (frees a registered buffer). NULL allowed; clears *b. */
void ts_coll_bench_destroy(ts_coll_bench **b);

#endif
