/* NIfTI-1 and NIfTI-2 volumes (.nii, .nii.gz, .hdr/.img) through libnifti2,
 * with the checks niftilib leaves out: the header is recognised before
 * niftilib sees it, and the voxel bytes are read here through zlib and
 * counted, so a truncated file is an error instead of zero-filled voxels.
 * Voxel (i, j, k, t) of a NIfTI file is element ((t*nz + k)*ny + j)*nx + i,
 * which is the tessera layout [C, D, H, W] with C = t, D = k, H = j, W = i:
 * no transpose is needed in either direction. */
#ifndef TS_IO_NIFTI_H
#define TS_IO_NIFTI_H

#include <stddef.h>
#include <stdint.h>

typedef struct ts_nifti {
    char *path;           /* the file name as given (owned) */
    int version;          /* 1 or 2 */
    int datatype;         /* NIFTI_TYPE_* of the file */
    int64_t dim[4];       /* nx, ny, nz, nt (nt = 1 for a 3-D volume) */
    double pixdim[4];     /* dx, dy, dz, dt */
    double scl_slope, scl_inter; /* applied by ts_nifti_get/ts_nifti_to_float when slope is finite and non-zero */
    double sform[16], qform[16]; /* (i, j, k, 1) -> (x, y, z, 1), row-major */
    int sform_code, qform_code;
    int64_t nvox;         /* nx*ny*nz*nt */
    int nbyper;
    void *data;           /* nvox voxels of datatype, native byte order */
} ts_nifti;

/* Local. Reads a NIfTI-1/2 file (header and voxels). Errors (TS_ERR_FORMAT
 * or TS_ERR_IO, naming the file): not NIfTI, garbage header, unsupported
 * datatype or dimensions (3-D, or 4-D with channels along t), truncated
 * voxel data or gzip stream. Free with ts_nifti_free. */
int ts_nifti_read(const char *path, ts_nifti **out);
void ts_nifti_free(ts_nifti **n);

/* Local. Voxel v (0 <= v < nvox) as double, scaled by scl_slope/scl_inter. */
double ts_nifti_get(const ts_nifti *n, int64_t v);
/* Local. All voxels as float32, scaled. Non-finite voxels (NaN, +-Inf,
 * also after scaling or the conversion to float) are TS_ERR_NUMERIC naming
 * the file, their count and the first voxel (i, j, k, t). */
int ts_nifti_to_float(const ts_nifti *n, float *out);
/* Local. As ts_nifti_to_float, but with replace non-NULL non-finite voxels
 * become *replace and *replaced (may be NULL) gets their count. */
int ts_nifti_to_float_replace(const ts_nifti *n, float *out, const float *replace, int64_t *replaced);

/* Local. Writes a volume: dim = nx, ny, nz, nt (nt = 1 for 3-D); pixdim dx,
 * dy, dz; sform/qform as above (qform is stored as a quaternion, so it must
 * be a rigid transform times the voxel sizes); datatype NIFTI_TYPE_UINT8,
 * INT16 or FLOAT32; version 1 or 2. ".gz" in the name compresses. Written to
 * a temporary name, read back and checked, then renamed. TS_NIFTI_* are
 * NIfTI's datatype codes (NIFTI_TYPE_* of <nifti1.h>), so that callers need
 * not include niftilib's headers. */
#define TS_NIFTI_UINT8 2
#define TS_NIFTI_INT16 4
#define TS_NIFTI_FLOAT32 16
typedef struct ts_nifti_geom {
    int64_t dim[4];
    double pixdim[3];
    double sform[16], qform[16];
    int sform_code, qform_code;
} ts_nifti_geom;
int ts_nifti_write(const char *path, const ts_nifti_geom *g, int datatype, int version, const void *data);

#endif
