/* Private to io/writer.c and io/writer_stats.c: the writer's state (struct
 * ts_dswriter) and the foreground coordinates the writer stores per sample.
 * writer.c creates the files and writes samples, the index and the root
 * attributes; writer_stats.c computes what is stored about a sample. Not
 * installed; nothing outside these two files includes it. */
#ifndef TS_IO_WRITER_IMPL_H
#define TS_IO_WRITER_IMPL_H

#include <stdint.h>

#include "io/fingerprint.h"
#include "io/h5.h"
#include "io/writer.h"

/* one compact row per sample, kept by every rank for the index */
typedef struct ts_dsw_row {
    char name[TS_IO_NAME_MAX];
    int32_t shard;
    int64_t shape[4];
    int64_t foreground;
} ts_dsw_row;

/* the writer (io/writer.h): created, written and finished by writer.c */
struct ts_dswriter {
    MPI_Comm comm;
    int rank, size;
    int collective;          /* 1: one file written by all ranks */
    char path[TS_IO_PATH_MAX];
    ts_dswriter_opts o;
    char **class_names, **channel_names;
    char source[TS_IO_PATH_MAX];
    int64_t n, *local;       /* this rank's sample indices */
    int64_t nlocal, rounds, round;
    /* files: collective mode uses files[0]; sharded mode files[s] for owned shards */
    hid_t *files;
    int *created;            /* per shard: this rank created the .partial */
    /* per-sample records */
    ts_dsw_row *rows;
    double *mean, *std, *min, *max, *pct; /* [n][C] ([n][C][NPCT]) */
    double *fgmean, *fgstd;  /* [n][C] over the foreground mask */
    int64_t *cls;            /* [n][K] */
    int64_t *nvox;
    uint8_t *have;           /* sample i was written */
    int finished, failed;
    void *chunkbuf;
    size_t chunkcap;
    int32_t *fg;             /* foreground coordinates scratch [FG_MAX][3] */
    ts_fp_acc *fp;           /* the fingerprint (io/fingerprint.h) */
    ts_fp_prep prep;
    ts_fg_intensity fi;      /* its foreground intensity statistics (finish) */
};

/* Local. Up to TS_IO_FG_MAX foreground coordinates of sample s (m: its
 * statistics, index and class voxel counts) into out [TS_IO_FG_MAX][3],
 * shared equally among the classes present, chosen by selection sampling
 * seeded with the writer's seed and the sample index (the same on every
 * run and rank count). Returns how many; cannot fail. */
int64_t ts_dsw_foreground(const ts_dswriter *w, const ts_sample *s, const ts_sample_meta *m, int32_t *out);

#endif
