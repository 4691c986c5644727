/* mpi: MPI_Allreduce itself, so the automatic choice can always fall back to
 * the vendor's algorithm. Half types use a user-defined op (reduce in
 * float32); AVG is SUM then a local division. Counts above INT_MAX go in
 * pieces. Cost: whatever the MPI library does. */
#include "tsbuild.h"
#include "collectives/coll_impl.h"

#include <limits.h>

#define HALF_OP(name, TOF, FROMF, EXPR)                                         \
    static void name(void *in, void *inout, int *len, MPI_Datatype *dt)         \
    {                                                                           \
        const uint16_t *x = in;                                                 \
        uint16_t *y = inout;                                                    \
        (void)dt;                                                               \
        for (int i = 0; i < *len; i++) {                                        \
            float a = TOF(x[i]), b = TOF(y[i]);                                 \
            y[i] = FROMF(EXPR);                                                 \
        }                                                                       \
    }
HALF_OP(bf16_sum, ts_bf16_to_f32, ts_f32_to_bf16, a + b)
HALF_OP(bf16_max, ts_bf16_to_f32, ts_f32_to_bf16, a > b ? a : b)
HALF_OP(bf16_min, ts_bf16_to_f32, ts_f32_to_bf16, a < b ? a : b)
HALF_OP(f16_sum, ts_f16_to_f32, ts_f32_to_f16, a + b)
HALF_OP(f16_max, ts_f16_to_f32, ts_f32_to_f16, a > b ? a : b)
HALF_OP(f16_min, ts_f16_to_f32, ts_f32_to_f16, a < b ? a : b)

static MPI_Op half_ops[2][3]; /* [bf16, f16][sum, max, min], created once */
static pthread_once_t half_once = PTHREAD_ONCE_INIT;
static int half_err;

static void make_half_ops(void)
{
    MPI_User_function *f[2][3] = {{bf16_sum, bf16_max, bf16_min}, {f16_sum, f16_max, f16_min}};
    for (int i = 0; i < 2; i++)
        for (int j = 0; j < 3; j++)
            if (MPI_Op_create(f[i][j], 1, &half_ops[i][j]) != MPI_SUCCESS) half_err = 1;
}

int ts_mpi_type_op(ts_dtype dt, ts_op op, MPI_Datatype *mt, MPI_Op *mo)
{
    int k = op == TS_OP_MAX ? 1 : op == TS_OP_MIN ? 2 : 0;
    static const MPI_Op builtin[3] = {MPI_SUM, MPI_MAX, MPI_MIN};
    switch (dt) {
    case TS_FLOAT32: *mt = MPI_FLOAT; break;
    case TS_FLOAT64: *mt = MPI_DOUBLE; break;
    case TS_INT32: *mt = MPI_INT32_T; break;
    case TS_INT64: *mt = MPI_INT64_T; break;
    case TS_UINT8: *mt = MPI_UINT8_T; break;
    case TS_BFLOAT16:
    case TS_FLOAT16:
        pthread_once(&half_once, make_half_ops);
        if (half_err) return TS_ERR(TS_ERR_MPI, "MPI_Op_create failed for half-precision reductions");
        *mt = MPI_UINT16_T;
        *mo = half_ops[dt == TS_FLOAT16][k];
        return 0;
    default: return TS_ERR(TS_ERR_UNSUPPORTED, "dtype %d", (int)dt);
    }
    *mo = builtin[k];
    return 0;
}

int ts_allreduce_mpi(ts_chan *ch, const ts_coll_args *a)
{
    MPI_Datatype mt;
    MPI_Op mo;
    const size_t es = ts_dtype_size(a->dt);
    TS_TRY(ts_mpi_type_op(a->dt, a->op, &mt, &mo));
    size_t n = ts_coll_pieces(a->count, INT_MAX / 2, 0, NULL, NULL);
    for (size_t i = 0; i < n; i++) {
        size_t o, l;
        ts_coll_pieces(a->count, INT_MAX / 2, i, &o, &l);
        const void *s = a->sendbuf == a->recvbuf ? MPI_IN_PLACE : (const char *)a->sendbuf + o * es;
        TS_MPI_TRY(MPI_Allreduce(s, (char *)a->recvbuf + o * es, (int)l, mt, mo, ch->comm));
    }
    ts_reduce_finish(a->recvbuf, a->count, a->dt, a->op, ch->topo.size);
    return 0;
}
