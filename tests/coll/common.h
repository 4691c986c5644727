/* Shared by the collective tests: the exact check pattern in any dtype, the
 * reference computed by MPI_Allreduce in float64 (exact for these values),
 * and element access by dtype. */
#ifndef TS_TESTS_COLL_COMMON_H
#define TS_TESTS_COLL_COMMON_H

#include <mpi.h>
#include <stdlib.h>
#include <string.h>

#include "collectives/check.h"
#include "collectives/coll.h"

static inline int tc_half(ts_dtype dt) { return dt == TS_BFLOAT16 || dt == TS_FLOAT16; }

#define tc_get ts_check_get
#define tc_set ts_check_set

static inline void tc_fill(void *b, size_t n, ts_dtype dt, int rank, int seed)
{
    for (size_t i = 0; i < n; i++) tc_set(b, i, dt, TS_CHECK_VALUE(i, rank, seed, tc_half(dt)));
}

/* The reference: MPI_Allreduce over the pattern as float64 (exact), then
 * the AVG division done as tessera documents it (in the dtype). */
static inline int tc_reference(double *ref, size_t n, ts_dtype dt, ts_op op, int rank, int p, int seed, MPI_Comm comm)
{
    for (size_t i = 0; i < n; i++) ref[i] = TS_CHECK_VALUE(i, rank, seed, tc_half(dt));
    MPI_Op mo = op == TS_OP_MAX ? MPI_MAX : op == TS_OP_MIN ? MPI_MIN : MPI_SUM;
    for (size_t o = 0; o < n; o += 1 << 20) {
        int len = (int)(n - o < (1u << 20) ? n - o : (1u << 20));
        if (MPI_Allreduce(MPI_IN_PLACE, ref + o, len, MPI_DOUBLE, mo, comm) != MPI_SUCCESS) return 1;
    }
    if (op == TS_OP_AVG)
        for (size_t i = 0; i < n; i++) {
            double s = ref[i];
            switch (dt) {
            case TS_INT32:
            case TS_INT64: ref[i] = (double)((long long)s / p); break;
            case TS_FLOAT32: ref[i] = (double)((float)s / (float)p); break;
            case TS_BFLOAT16: ref[i] = ts_bf16_to_f32(ts_f32_to_bf16((float)s / (float)p)); break;
            case TS_FLOAT16: ref[i] = ts_f16_to_f32(ts_f32_to_f16((float)s / (float)p)); break;
            default: ref[i] = s / p; break;
            }
        }
    return 0;
}

/* elements of b[lo, hi) that differ from ref */
static inline size_t tc_wrong(const void *b, const double *ref, size_t lo, size_t hi, ts_dtype dt)
{
    size_t w = 0;
    for (size_t i = lo; i < hi; i++)
        if (tc_get(b, i, dt) != ref[i]) w++;
    return w;
}

#endif
