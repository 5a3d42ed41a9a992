/* The C ABI of ppcc's CPU support library (codegen/src/support.c), declared once.
 *
 * The lowering (codegen/src/lower/) declares these functions in the MLIR it emits
 * (`llvm.func @ppcc_sgemm(...)`); codegen's tests check each such declaration against the
 * prototypes below (`support_declarations_match_the_header`). build.rs compiles support.c
 * with this header for any CPU of the architecture (the host code of CUDA modules, and a
 * check at build time that it compiles); CPU modules get it compiled for the host CPU
 * (`-march=native`) on first use and cached (codegen/src/compile.rs).
 *
 * Matrices are row-major; every routine writes only its output buffers. */
#ifndef PPCC_SUPPORT_H
#define PPCC_SUPPORT_H

#include <stddef.h>
#include <stdint.h>

/* C = alpha * op(A) op(B) [+ beta * C0], m x n, row stride ldc.
 *   flags bit 0: op(A) = A^T (A stored k x m, row stride lda), else A is m x k;
 *   flags bit 1: op(B) = B^T (B stored n x k, row stride ldb), else B is k x n;
 *   c0: NULL, or C0 broadcast to m x n: element (i, j) at c0[i*c0_rs + j*c0_cs] (strides 0
 *       along broadcast dimensions); c0 may equal c (accumulate in place). */
void ppcc_sgemm(int64_t flags, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                int64_t lda, const float *b, int64_t ldb, float beta, const float *c0,
                int64_t c0_rs, int64_t c0_cs, float *c, int64_t ldc);
void ppcc_dgemm(int64_t flags, int64_t m, int64_t n, int64_t k, double alpha, const double *a,
                int64_t lda, const double *b, int64_t ldb, double beta, const double *c0,
                int64_t c0_rs, int64_t c0_cs, double *c, int64_t ldc);

/* `count` products C_i = alpha * op(A_i) op(B_i) [+ beta * C_i], X_i = x + i * stride_x (stride
 * 0 repeats one matrix); beta 0: C_i is written, not read. BLAS's strided-batched GEMM, as
 * the CUDA target's cuBLAS form calls it (there renamed ppcc_gpu_*; the CPU runs it in
 * tests). */
void ppcc_sgemm_batched(int64_t flags, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, int64_t stride_a, const float *b,
                        int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc,
                        int64_t stride_c, int64_t count);
void ppcc_dgemm_batched(int64_t flags, int64_t m, int64_t n, int64_t k, double alpha,
                        const double *a, int64_t lda, int64_t stride_a, const double *b,
                        int64_t ldb, int64_t stride_b, double beta, double *c, int64_t ldc,
                        int64_t stride_c, int64_t count);

/* Threads one GEMM call may use (default 1: each pipeline stage runs on its own core). */
void ppcc_set_num_threads(int n);
int ppcc_get_num_threads(void);

/* Softmax (or log-softmax when log_ != 0) of each of `rows` contiguous rows of n floats. */
void ppcc_softmax_f32(int64_t rows, int64_t n, const float *x, float *y, int64_t log_);

/* Layer normalisation of `rows` contiguous rows of n floats with scale and bias (bias may be
 * NULL); mean and inv (1/sqrt(var + eps)), one float per row, are written when not NULL. */
void ppcc_layernorm_f32(int64_t rows, int64_t n, const float *x, const float *scale,
                        const float *bias, double eps, float *y, float *mean, float *inv);

/* Per-op timing of modules lowered with profile_ops: nanoseconds per op id. */
int64_t ppcc_prof_begin(void);
void ppcc_prof_end(int64_t t0, int64_t op);
void ppcc_prof_take(int64_t *out, int64_t n);

/* The generated code's temporaries (its malloc / aligned_alloc / free), counted per thread;
 * ppcc_tmp_take_peak returns the most bytes live at once since the last take. */
void *ppcc_tmp_malloc(size_t n);
void *ppcc_tmp_aligned_alloc(size_t align, size_t n);
void ppcc_tmp_free(void *q);
uint64_t ppcc_tmp_take_peak(void);

/* What MLIR's memref.copy lowering calls for copies between non-contiguous memrefs (the
 * signature of MLIR's CRunnerUtils). */
typedef struct {
  int64_t rank;
  void *descriptor; /* {T *allocated, T *aligned, i64 offset, i64 sizes[rank], i64 strides[rank]} */
} ppcc_unranked_memref;
void memrefCopy(int64_t elem_size, ppcc_unranked_memref *src, ppcc_unranked_memref *dst);

#endif /* PPCC_SUPPORT_H */
