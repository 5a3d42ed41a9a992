/* Runtime support compiled into every module.so that ppcc-codegen links (see
 * codegen/src/compile.rs: `cc -O3 -fPIC -march=native` on this file, cached per source,
 * compiler and host CPU). Everything here is ppcc's own code; a module.so needs nothing
 * beyond libc, libm and libpthread at run time.
 *
 * Exported (declared in codegen/include/ppcc_support.h, the ABI's one declaration):
 *   ppcc_sgemm / ppcc_dgemm   C = alpha * op(A) op(B) [+ beta * C0], row-major, the entry the
 *                             lowered matmul / batch matmul / gemm ops call;
 *   ppcc_sgemm_batched / ppcc_dgemm_batched  strided batches of those (the CUDA target's
 *                             cuBLAS form, run on the CPU by the tests);
 *   ppcc_set_num_threads(n)   threads one GEMM call may use (default 1: in pipelined
 *                             training each stage worker runs on its own core);
 *   ppcc_get_num_threads()
 *   ppcc_softmax_f32          softmax / log_softmax over a contiguous last axis (f32);
 *   ppcc_layernorm_f32        layer normalisation over contiguous trailing axes (f32);
 *   ppcc_prof_begin/_end/_take  per-op timing of modules lowered with profile_ops;
 *   ppcc_tmp_malloc/_aligned_alloc/_free  the generated code's temporaries (counted);
 *   ppcc_tmp_take_peak        the most bytes of them live at once since the last take;
 *   memrefCopy                the ABI MLIR's memref.copy lowering calls for copies between
 *                             non-contiguous memrefs (same signature as MLIR's CRunnerUtils).
 *
 * The GEMM is a BLIS-style blocked algorithm: B is packed in KC x NC blocks into NR-column
 * panels, A in KC x MC blocks into MR-row panels, and a register-blocked microkernel
 * computes MR x NR tiles of C (MR rows of broadcast A values against two vectors of B per
 * k step, all accumulators in registers). GCC/Clang vector extensions give one kernel
 * source for AVX-512 (zmm), AVX2 (ymm) and anything else (16-byte vectors); with
 * AVX-512 the packing of transposed operands uses in-register 16 x 16 transposes.
 *
 * This file includes itself once per element type (PPCC_T = float, then double).
 */
#ifndef PPCC_T

#include "ppcc_support.h"

#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#define PPCC_VBYTES 64
#define PPCC_MR_BIG 14
#define PPCC_MR_SMALL 8
#elif defined(__AVX2__) || defined(__AVX__)
#define PPCC_VBYTES 32
#define PPCC_MR_BIG 6
#define PPCC_MR_SMALL 4
#else
#define PPCC_VBYTES 16
#define PPCC_MR_BIG 6
#define PPCC_MR_SMALL 4
#endif

/* Blocking in bytes of one row of a packed block: KC elements of k, NC columns of B, MC
 * rows of A (per element type: 512 / 4096 / 1024 floats, 256 / 2048 / 512 doubles). */
#define PPCC_KC_BYTES 2048
#define PPCC_NC_BYTES 16384
#define PPCC_MC_BYTES 4096

#define PPCC_CAT_(a, b) a##b
#define PPCC_CAT(a, b) PPCC_CAT_(a, b)

/* ---- threads ---- */

static int ppcc_threads = 1;

void ppcc_set_num_threads(int n) {
  __atomic_store_n(&ppcc_threads, n < 1 ? 1 : n > 256 ? 256 : n, __ATOMIC_RELAXED);
}

int ppcc_get_num_threads(void) { return __atomic_load_n(&ppcc_threads, __ATOMIC_RELAXED); }

/* ---- op profiling (modules lowered with profile_ops) ---- */

/* Nanoseconds per op id, summed over calls since the last ppcc_prof_take; one table per
 * process (profiling runs one function at a time). */
static int64_t *ppcc_prof_ns;
static int64_t ppcc_prof_cap;

int64_t ppcc_prof_begin(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

void ppcc_prof_end(int64_t t0, int64_t op) {
  int64_t dt = ppcc_prof_begin() - t0;
  if (op < 0) return;
  if (op >= ppcc_prof_cap) {
    int64_t cap = ppcc_prof_cap ? ppcc_prof_cap : 256;
    while (cap <= op) cap *= 2;
    int64_t *p = (int64_t *)realloc(ppcc_prof_ns, (size_t)cap * sizeof(int64_t));
    if (!p) return;
    memset(p + ppcc_prof_cap, 0, (size_t)(cap - ppcc_prof_cap) * sizeof(int64_t));
    ppcc_prof_ns = p;
    ppcc_prof_cap = cap;
  }
  ppcc_prof_ns[op] += dt;
}

/* Copy the first n counters to out (zeros past the table), then clear the table. */
void ppcc_prof_take(int64_t *out, int64_t n) {
  for (int64_t i = 0; i < n; i++) out[i] = i < ppcc_prof_cap ? ppcc_prof_ns[i] : 0;
  if (ppcc_prof_cap) memset(ppcc_prof_ns, 0, (size_t)ppcc_prof_cap * sizeof(int64_t));
}

/* ---- temporaries of the generated code ---- */

/* The generated functions' temporaries (MLIR's memref.alloc / dealloc, lowered to
 * malloc / aligned_alloc / free) come here in CPU modules (compile.rs renames the calls), so
 * the runtime can report the most bytes live at once per call: a header before each block
 * keeps its size and offset. Counters are per thread: each stage's functions run on one
 * thread at a time. */
static _Thread_local uint64_t ppcc_tmp_live, ppcc_tmp_peak;

static void *ppcc_tmp_track(char *base, size_t off, size_t n) {
  if (!base) return NULL;
  char *p = base + off;
  ((uint64_t *)p)[-1] = (uint64_t)n;
  ((uint64_t *)p)[-2] = (uint64_t)off;
  ppcc_tmp_live += n;
  if (ppcc_tmp_live > ppcc_tmp_peak) ppcc_tmp_peak = ppcc_tmp_live;
  return p;
}

void *ppcc_tmp_malloc(size_t n) { return ppcc_tmp_track((char *)malloc(n + 16), 16, n); }

void *ppcc_tmp_aligned_alloc(size_t align, size_t n) {
  if (align < 16) align = 16;
  size_t total = n + align;
  total = (total + align - 1) / align * align;
  return ppcc_tmp_track((char *)aligned_alloc(align, total), align, n);
}

void ppcc_tmp_free(void *q) {
  if (!q) return;
  uint64_t n = ((uint64_t *)q)[-1], off = ((uint64_t *)q)[-2];
  ppcc_tmp_live -= n < ppcc_tmp_live ? n : ppcc_tmp_live;
  free((char *)q - off);
}

/* The most bytes of temporaries live at once on this thread since the last take; the
 * count restarts from what is live now. */
uint64_t ppcc_tmp_take_peak(void) {
  uint64_t p = ppcc_tmp_peak;
  ppcc_tmp_peak = ppcc_tmp_live;
  return p;
}

/* ---- packing workspace ---- */

typedef struct {
  void *a, *b;
  size_t acap, bcap; /* bytes */
} ppcc_ws;

static void ppcc_ws_free(ppcc_ws *w) {
  free(w->a);
  free(w->b);
  w->a = w->b = NULL;
  w->acap = w->bcap = 0;
}

/* Workspaces kept between calls (so that large packing buffers are not mapped and
 * faulted in again on every call), one per concurrent caller up to PPCC_WS_SLOTS; a caller
 * that finds none free uses a temporary one. No thread-local storage or thread-exit hooks:
 * a module may be unloaded while threads that called it live on. The kept buffers are
 * freed when the module is unloaded. */
#define PPCC_WS_SLOTS 16
static struct {
  int busy;
  ppcc_ws ws;
} ppcc_ws_pool[PPCC_WS_SLOTS];

static ppcc_ws *ppcc_ws_acquire(void) {
  for (int i = 0; i < PPCC_WS_SLOTS; i++)
    if (!__atomic_exchange_n(&ppcc_ws_pool[i].busy, 1, __ATOMIC_ACQUIRE))
      return &ppcc_ws_pool[i].ws;
  return (ppcc_ws *)calloc(1, sizeof(ppcc_ws));
}

static void ppcc_ws_release(ppcc_ws *w) {
  for (int i = 0; i < PPCC_WS_SLOTS; i++)
    if (w == &ppcc_ws_pool[i].ws) {
      __atomic_store_n(&ppcc_ws_pool[i].busy, 0, __ATOMIC_RELEASE);
      return;
    }
  if (w) {
    ppcc_ws_free(w);
    free(w);
  }
}

__attribute__((destructor)) static void ppcc_ws_pool_free(void) {
  for (int i = 0; i < PPCC_WS_SLOTS; i++) ppcc_ws_free(&ppcc_ws_pool[i].ws);
}

/* At least `need` bytes at *p, 64-byte aligned; NULL when out of memory. */
static void *ppcc_reserve(void **p, size_t *cap, size_t need) {
  if (need > *cap) {
    free(*p);
    *p = aligned_alloc(64, (need + 63) / 64 * 64);
    *cap = *p ? need : 0;
  }
  return *p;
}

#if defined(__AVX512F__)
/* Transpose the `rows` x `cols` (<= 16 x 16) block at `src` (row stride `ld`; rows past
 * `rows` read as zeros) and store its column p, the first `width` lanes, at
 * dst + p * dstride for p < cols. */
static inline void ppcc_tr16(const float *src, int64_t ld, int rows, int cols, float *dst,
                             int64_t dstride, int width) {
  __m512 r[16], t[16];
  __mmask16 cm = cols >= 16 ? 0xFFFF : (__mmask16)((1u << cols) - 1);
  for (int i = 0; i < 16; i++)
    r[i] = i < rows ? _mm512_maskz_loadu_ps(cm, src + i * ld) : _mm512_setzero_ps();
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    r[i] = _mm512_shuffle_ps(t[i], t[i + 2], 0x44);
    r[i + 1] = _mm512_shuffle_ps(t[i], t[i + 2], 0xEE);
    r[i + 2] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    r[i + 3] = _mm512_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int h = 0; h < 16; h += 8)
    for (int i = 0; i < 4; i++) {
      t[h + i] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0x88);
      t[h + i + 4] = _mm512_shuffle_f32x4(r[h + i], r[h + i + 4], 0xdd);
    }
  for (int i = 0; i < 8; i++) {
    r[i] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0x88);
    r[i + 8] = _mm512_shuffle_f32x4(t[i], t[i + 8], 0xdd);
  }
  __mmask16 wm = width >= 16 ? 0xFFFF : (__mmask16)((1u << width) - 1);
  for (int p = 0; p < cols; p++) _mm512_mask_storeu_ps(dst + p * dstride, wm, r[p]);
}
#endif

/* ---- bf16 rounding ----
   On CPUs without AVX512-BF16, LLVM lowers `fptrunc` to bfloat into calls of these, which
   GCC 12's libgcc lacks (GCC 13 and compiler-rt have them); undefined, the module would not
   load. The x86-64 psABI returns a bf16 in xmm0, as it returns a _Float16. */
#if defined(__x86_64__)
static inline _Float16 ppcc_half_of_bits(uint16_t b) {
  _Float16 h;
  memcpy(&h, &b, sizeof h);
  return h;
}

/* f32 -> bf16, round to nearest even; a NaN stays a (quiet) NaN. */
__attribute__((visibility("hidden"))) _Float16 __truncsfbf2(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  uint16_t r;
  if ((u & 0x7fffffffu) > 0x7f800000u)
    r = (uint16_t)((u >> 16) | 0x40u);
  else
    r = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  return ppcc_half_of_bits(r);
}

/* f64 -> bf16 rounded once: round to odd into f32 (toward zero, then set the last bit when
   inexact; f32 has 16 more bits than bf16, so the second rounding is exact), then to even. */
__attribute__((visibility("hidden"))) _Float16 __truncdfbf2(double x) {
  float f = (float)x;
  if (f == f && (double)f != x) {
    if (fabs((double)f) > fabs(x)) f = nextafterf(f, 0.0f);
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    u |= 1u;
    memcpy(&f, &u, sizeof f);
  }
  return __truncsfbf2(f);
}
#endif

/* ---- memref.copy for non-contiguous memrefs ---- */

void memrefCopy(int64_t elem_size, ppcc_unranked_memref *src, ppcc_unranked_memref *dst) {
  int64_t rank = src->rank;
  const int64_t *sd = (const int64_t *)src->descriptor, *dd = (const int64_t *)dst->descriptor;
  const char *sp = (const char *)(intptr_t)sd[1] + sd[2] * elem_size;
  char *dp = (char *)(intptr_t)dd[1] + dd[2] * elem_size;
  if (rank == 0) {
    memcpy(dp, sp, (size_t)elem_size);
    return;
  }
  const int64_t *sizes = sd + 3, *sstr = sd + 3 + rank, *dstr = dd + 3 + dst->rank;
  for (int64_t d = 0; d < rank; d++)
    if (sizes[d] == 0) return;
  int64_t inner = sizes[rank - 1];
  int contiguous_rows = sstr[rank - 1] == 1 && dstr[rank - 1] == 1;
  int64_t idx[rank > 0 ? rank : 1];
  memset(idx, 0, sizeof idx);
  int64_t so = 0, doff = 0;
  for (;;) {
    if (contiguous_rows) {
      memcpy(dp + doff * elem_size, sp + so * elem_size, (size_t)(inner * elem_size));
    } else {
      for (int64_t j = 0; j < inner; j++)
        memcpy(dp + (doff + j * dstr[rank - 1]) * elem_size,
               sp + (so + j * sstr[rank - 1]) * elem_size, (size_t)elem_size);
    }
    int64_t d = rank - 2;
    for (; d >= 0; d--) {
      so += sstr[d];
      doff += dstr[d];
      if (++idx[d] < sizes[d]) break;
      so -= sizes[d] * sstr[d];
      doff -= sizes[d] * dstr[d];
      idx[d] = 0;
    }
    if (d < 0) return;
  }
}

/* ---- Row-wise softmax and layer normalisation over a contiguous last axis, f32 ----
 *
 * The same formulas as the interpreter (and as the generic linalg lowering in
 * codegen/src/lower/norm.rs): statistics in f64, one rounding to f32 per result. exp is the
 * f32 polynomial of codegen/src/lower/mathfn.rs (coefficients fitted by
 * codegen/tools/fit_mathfn.py; the two must stay equal), here on GCC/Clang vectors so one
 * row of 16 floats is one AVX-512 register. */

typedef float ppcc_vf __attribute__((vector_size(PPCC_VBYTES), aligned(PPCC_VBYTES)));
typedef float ppcc_uvf __attribute__((vector_size(PPCC_VBYTES), aligned(4)));
typedef int32_t ppcc_vi __attribute__((vector_size(PPCC_VBYTES), aligned(PPCC_VBYTES)));
#define PPCC_VF (PPCC_VBYTES / 4)

/* Lanes of `a` where `m` is all ones, else of `b`. */
static inline ppcc_vf ppcc_vsel(ppcc_vi m, ppcc_vf a, ppcc_vf b) {
  return (ppcc_vf)(((ppcc_vi)a & m) | ((ppcc_vi)b & ~m));
}

/* e^x per lane: x clamped to [-104, 89], n = floor(x log2 e + 1/2), r = x - n ln 2 (two
 * parts), e^r = 1 + r + r^2 P(r), times 2^n in two halves; NaN stays NaN. */
static inline ppcc_vf ppcc_vexp(ppcc_vf x) {
  const ppcc_vf zero = {0};
  ppcc_vf xc = ppcc_vsel(x < -104.0f, zero - 104.0f, x);
  xc = ppcc_vsel(xc > 89.0f, zero + 89.0f, xc);
  xc = ppcc_vsel(x != x, zero, xc); /* NaN: any finite value, fixed below */
  ppcc_vf k = xc * 1.44269504088896341f + 0.5f;
  ppcc_vi ki = __builtin_convertvector(k, ppcc_vi); /* truncation; |k| < 152 */
  ppcc_vf n = __builtin_convertvector(ki, ppcc_vf);
  ppcc_vi below = n > k; /* floor: one less where truncation went up */
  n += __builtin_convertvector(below, ppcc_vf);
  ki += below;
  ppcc_vf r = xc - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  ppcc_vf p = r * 1.98992762170281255e-04f + 1.39336435225996232e-03f;
  p = p * r + 8.33329848036461901e-03f;
  p = p * r + 4.16664649761263883e-02f;
  p = p * r + 1.66666667190076917e-01f;
  p = p * r + 5.00000001346221912e-01f;
  ppcc_vf y = (r * r) * p + r + 1.0f;
  ppcc_vi n1 = ki >> 1, n2 = ki - n1;
  y *= (ppcc_vf)((n1 + 127) << 23);
  y *= (ppcc_vf)((n2 + 127) << 23);
  return ppcc_vsel(x != x, x, y);
}

/* Lanes [0, len) from p, the rest `pad`. */
static inline ppcc_vf ppcc_vload_pad(const float *p, int64_t len, float pad) {
  if (len >= PPCC_VF) return *(const ppcc_uvf *)p;
  ppcc_vf v;
  for (int i = 0; i < PPCC_VF; i++) v[i] = i < len ? p[i] : pad;
  return v;
}

/* Lanes [0, len) to p. */
static inline void ppcc_vstore_part(float *p, ppcc_vf v, int64_t len) {
  if (len >= PPCC_VF) {
    *(ppcc_uvf *)p = v;
    return;
  }
  for (int64_t i = 0; i < len; i++) p[i] = v[i];
}

/* The largest lane (no lane is NaN). */
static inline float ppcc_hmax(ppcc_vf v) {
#if defined(__AVX512F__)
  return _mm512_reduce_max_ps((__m512)v);
#else
  float m = v[0];
  for (int i = 1; i < PPCC_VF; i++) m = v[i] > m ? v[i] : m;
  return m;
#endif
}

#if defined(__AVX512F__)
/* The two f64 halves of 16 floats; `lo`'s then `hi`'s lanes back as 16 floats. */
static inline __m512d ppcc_lo_pd(__m512 v) { return _mm512_cvtps_pd(_mm512_castps512_ps256(v)); }
static inline __m512d ppcc_hi_pd(__m512 v) {
  return _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
}
static inline __m512 ppcc_join_ps(__m512d lo, __m512d hi) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm512_cvtpd_ps(lo))),
                                             _mm256_castps_pd(_mm512_cvtpd_ps(hi)), 1));
}

/* x - c (mul = 0) or x * c (mul = 1) computed in f64, each lane rounded once to f32. */
static inline __m512 ppcc_f64_op(__m512 x, __m512d c, int mul) {
  __m512d lo = ppcc_lo_pd(x), hi = ppcc_hi_pd(x);
  return mul ? ppcc_join_ps(_mm512_mul_pd(lo, c), _mm512_mul_pd(hi, c))
             : ppcc_join_ps(_mm512_sub_pd(lo, c), _mm512_sub_pd(hi, c));
}

/* One row of ppcc_softmax_f32 in AVX-512 registers (masked loads for the last vector). */
static inline void ppcc_softmax_row16(int64_t n, const float *xr, float *yr, int64_t log_) {
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  __m512 mv = ninf;
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 k = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
    /* max(v, m) gives m where v is NaN: NaN is ignored, as f64::max does. */
    mv = _mm512_max_ps(_mm512_mask_loadu_ps(ninf, k, xr + j), mv);
  }
  float m = _mm512_reduce_max_ps(mv);
  /* x - s rounded to f32 (the interpreter rounds the f64 difference: at most an ulp of
   * x - s apart, well inside exp's own error). */
  __m512 sv = _mm512_set1_ps(__builtin_isfinite(m) ? m : 0.0f);
  __m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
  for (int64_t j = 0; j < n; j += 16) {
    __mmask16 k = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
    __m512 v = _mm512_mask_loadu_ps(ninf, k, xr + j);
    __m512 e = (__m512)ppcc_vexp((ppcc_vf)_mm512_sub_ps(v, sv)); /* 0 in masked lanes */
    s0 = _mm512_add_pd(s0, ppcc_lo_pd(e));
    s1 = _mm512_add_pd(s1, ppcc_hi_pd(e));
    if (!log_) _mm512_mask_storeu_ps(yr + j, k, e);
  }
  double s = _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
  if (log_) {
    __m512d ls = _mm512_set1_pd((double)_mm512_cvtss_f32(sv) + log(s));
    for (int64_t j = 0; j < n; j += 16) {
      __mmask16 k = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
      _mm512_mask_storeu_ps(yr + j, k, ppcc_f64_op(_mm512_maskz_loadu_ps(k, xr + j), ls, 0));
    }
  } else {
    __m512d inv = _mm512_set1_pd(1.0 / s);
    for (int64_t j = 0; j < n; j += 16) {
      __mmask16 k = n - j >= 16 ? 0xFFFF : (__mmask16)((1u << (n - j)) - 1);
      _mm512_mask_storeu_ps(yr + j, k, ppcc_f64_op(_mm512_maskz_loadu_ps(k, yr + j), inv, 1));
    }
  }
}
#endif

/* Each of `rows` rows of `n` contiguous floats: y = softmax(x) = e^(x - s) / Σ e^(x - s),
 * or log_softmax(x) = (x - s) - ln Σ e^(x - s) when `log_`, with s the row's maximum (NaN
 * ignored; 0 when not finite). Σ in f64. */
void ppcc_softmax_f32(int64_t rows, int64_t n, const float *x, float *y, int64_t log_) {
#if defined(__AVX512F__)
  int64_t r = 0;
  if (n <= 16 && !log_) {
    /* Short rows: four at a time, so that four independent max → exp → sum → scale chains
     * overlap (one row alone is mostly latency). */
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
    __mmask16 k = (__mmask16)((1u << n) - 1);
    for (; r + 4 <= rows; r += 4) {
      __m512 v[4], e[4];
      double inv[4];
      for (int i = 0; i < 4; i++) v[i] = _mm512_mask_loadu_ps(ninf, k, x + (r + i) * n);
      for (int i = 0; i < 4; i++) {
        float m = _mm512_reduce_max_ps(_mm512_max_ps(v[i], ninf));
        __m512 sv = _mm512_set1_ps(__builtin_isfinite(m) ? m : 0.0f);
        e[i] = (__m512)ppcc_vexp((ppcc_vf)_mm512_sub_ps(v[i], sv));
      }
      for (int i = 0; i < 4; i++)
        inv[i] = _mm512_reduce_add_pd(_mm512_add_pd(ppcc_lo_pd(e[i]), ppcc_hi_pd(e[i])));
      __m256d iv = _mm256_div_pd(_mm256_set1_pd(1.0), _mm256_loadu_pd(inv));
      _mm256_storeu_pd(inv, iv);
      for (int i = 0; i < 4; i++)
        _mm512_mask_storeu_ps(y + (r + i) * n, k, ppcc_f64_op(e[i], _mm512_set1_pd(inv[i]), 1));
    }
  }
  for (; r < rows; r++) ppcc_softmax_row16(n, x + r * n, y + r * n, log_);
#else
  const float ninf = -__builtin_inff();
  for (int64_t r = 0; r < rows; r++) {
    const float *xr = x + r * n;
    float *yr = y + r * n;
    ppcc_vf mv = (ppcc_vf){0} + ninf;
    for (int64_t j = 0; j < n; j += PPCC_VF) {
      ppcc_vf v = ppcc_vload_pad(xr + j, n - j, ninf);
      ppcc_vi gt = v > mv;
      mv = ppcc_vsel(gt, v, mv);
    }
    float m = ppcc_hmax(mv);
    float shift = __builtin_isfinite(m) ? m : 0.0f;
    double s = 0;
    for (int64_t j = 0; j < n; j += PPCC_VF) {
      ppcc_vf e = ppcc_vexp(ppcc_vload_pad(xr + j, n - j, ninf) - shift);
      for (int i = 0; i < PPCC_VF; i++) s += (double)e[i];
      if (!log_) ppcc_vstore_part(yr + j, e, n - j);
    }
    if (log_) {
      double ls = (double)shift + log(s);
      for (int64_t j = 0; j < n; j++) yr[j] = (float)((double)xr[j] - ls);
    } else {
      double inv = 1.0 / s;
      for (int64_t j = 0; j < n; j++) yr[j] = (float)((double)yr[j] * inv);
    }
  }
#endif
}

/* Each of `rows` rows of `n` contiguous floats: mean and variance in f64 (population),
 * inv = 1 / sqrt(var + eps), y = (x - mean) · inv · scale (+ bias), scale and bias of `n`
 * floats (bias may be NULL); `mean` / `inv` (one float per row) are written when not NULL. */
void ppcc_layernorm_f32(int64_t rows, int64_t n, const float *x, const float *scale,
                        const float *bias, double eps, float *y, float *mean, float *inv) {
  /* Blocks of 8 rows: the per-row divisions and square roots run as one vector operation
   * for the block instead of one long dependent chain per row. */
  enum { B = 8 };
  for (int64_t r0 = 0; r0 < rows; r0 += B) {
    int64_t nb = rows - r0 < B ? rows - r0 : B;
    double mu[B], is[B];
    for (int64_t b = 0; b < B; b++) {
      const float *xr = x + (r0 + (b < nb ? b : 0)) * n;
      double acc[8] = {0};
      int64_t j = 0;
      for (; j + 8 <= n; j += 8)
        for (int i = 0; i < 8; i++) acc[i] += (double)xr[j + i];
      for (; j < n; j++) acc[0] += (double)xr[j];
      mu[b] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
    for (int b = 0; b < B; b++) mu[b] /= (double)n;
    for (int64_t b = 0; b < B; b++) {
      const float *xr = x + (r0 + (b < nb ? b : 0)) * n;
      double acc[8] = {0};
      int64_t j = 0;
      for (; j + 8 <= n; j += 8)
        for (int i = 0; i < 8; i++) {
          double t = (double)xr[j + i] - mu[b];
          acc[i] += t * t;
        }
      for (; j < n; j++) {
        double t = (double)xr[j] - mu[b];
        acc[0] += t * t;
      }
      is[b] = ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    }
    for (int b = 0; b < B; b++) is[b] = 1.0 / sqrt(is[b] / (double)n + eps);
    for (int64_t b = 0; b < nb; b++) {
      const float *xr = x + (r0 + b) * n;
      float *yr = y + (r0 + b) * n;
      double m = mu[b], v = is[b];
      if (bias)
        for (int64_t j = 0; j < n; j++)
          yr[j] = (float)(((double)xr[j] - m) * v * (double)scale[j] + (double)bias[j]);
      else
        for (int64_t j = 0; j < n; j++) yr[j] = (float)(((double)xr[j] - m) * v * (double)scale[j]);
      if (mean) mean[r0 + b] = (float)m;
      if (inv) inv[r0 + b] = (float)v;
    }
  }
}

/* ---- GEMM, once per element type ---- */

#define PPCC_T float
#define PPCC_S s
#include __FILE__
#undef PPCC_T
#undef PPCC_S
#define PPCC_T double
#define PPCC_S d
#include __FILE__
#undef PPCC_T
#undef PPCC_S

#else /* PPCC_T: the GEMM for one element type */

#define T PPCC_T
#define F(name) PPCC_CAT(PPCC_CAT(name, _), PPCC_S)
#define VL (PPCC_VBYTES / (int)sizeof(T))
#define NR (2 * VL)
#define KC (PPCC_KC_BYTES / (int64_t)sizeof(T))
#define NC (PPCC_NC_BYTES / (int64_t)sizeof(T))
#define MC (PPCC_MC_BYTES / (int64_t)sizeof(T))

typedef T F(vec) __attribute__((vector_size(PPCC_VBYTES), aligned(PPCC_VBYTES)));
typedef T F(uvec) __attribute__((vector_size(PPCC_VBYTES), aligned(sizeof(T))));

/* How a microkernel combines its tile with C: overwrite, add, or add beta * C. */
enum { F(SET) = 0, F(ADD) = 1, F(BETA) = 2 };

/* The store of a kernel's MRK x NV*VL tile `acc` into c (i < mr, j < nr): c = alpha * acc,
 * or + c, or + beta * c, by `mode`. */
#define PPCC_KERNEL_STORE(MRK, NV)                                                             \
  if (mr == MRK && nr == NV * VL) {                                                            \
    for (int i = 0; i < MRK; i++)                                                              \
      for (int v = 0; v < NV; v++) {                                                           \
        F(uvec) *cv = (F(uvec) *)(c + i * ldc + v * VL);                                       \
        F(vec) r = acc[i][v];                                                                  \
        if (alpha != 1) r *= alpha;                                                            \
        if (mode == F(ADD))                                                                    \
          r += *cv;                                                                            \
        else if (mode == F(BETA))                                                              \
          r += beta * *cv;                                                                     \
        *cv = r;                                                                               \
      }                                                                                        \
  } else {                                                                                     \
    T tile[MRK][NV * VL] __attribute__((aligned(PPCC_VBYTES)));                                \
    for (int i = 0; i < MRK; i++)                                                              \
      for (int v = 0; v < NV; v++) *(F(vec) *)&tile[i][v * VL] = acc[i][v];                    \
    for (int64_t i = 0; i < mr; i++)                                                           \
      for (int64_t j = 0; j < nr; j++) {                                                       \
        T r = tile[i][j];                                                                      \
        if (alpha != 1) r *= alpha;                                                            \
        if (mode == F(ADD))                                                                    \
          r += c[i * ldc + j];                                                                 \
        else if (mode == F(BETA))                                                              \
          r += beta * c[i * ldc + j];                                                          \
        c[i * ldc + j] = r;                                                                    \
      }                                                                                        \
  }

/* c[i*ldc + j] <- alpha * sum_p a[p*MRK + i] * b[p*NR + j] (+ c or + beta*c by `mode`) for
 * i < mr, j < nr <= NV*VL: MRK x NV vectors of accumulators (NV = 1 for a last strip of
 * at most VL columns, which reads the first half of the packed NR-column panel). */
#define PPCC_KERNEL(NAME, MRK, NV)                                                             \
  static void NAME(int64_t kc, const T *restrict a, const T *restrict b, T *restrict c,       \
                   int64_t ldc, int64_t mr, int64_t nr, T alpha, T beta, int mode) {           \
    F(vec) acc[MRK][NV];                                                                       \
    for (int i = 0; i < MRK; i++)                                                              \
      for (int v = 0; v < NV; v++) acc[i][v] = (F(vec)){0};                                    \
    for (int64_t p = 0; p < kc; p++) {                                                         \
      F(vec) bv[NV];                                                                           \
      for (int v = 0; v < NV; v++) bv[v] = *(const F(vec) *)(b + p * NR + v * VL);             \
      _Pragma("GCC unroll 16") for (int i = 0; i < MRK; i++) {                                 \
        T av = a[p * MRK + i];                                                                 \
        for (int v = 0; v < NV; v++) acc[i][v] += av * bv[v];                                  \
      }                                                                                        \
    }                                                                                          \
    PPCC_KERNEL_STORE(MRK, NV)                                                                 \
  }

/* The same tile read from unpacked operands: row i of A at a + i*lda (rows past mr read
 * row mr-1 again, their results are not stored), row p of B's NV*VL columns at b + p*ldb
 * (all of them inside B: the caller passes a packed copy for a last, narrower strip). */
#define PPCC_KERNEL_DIRECT(NAME, MRK, NV)                                                      \
  static void NAME(int64_t kc, const T *restrict a, int64_t lda, const T *restrict b,         \
                   int64_t ldb, T *restrict c, int64_t ldc, int64_t mr, int64_t nr, T alpha,   \
                   T beta, int mode) {                                                         \
    const T *ar[MRK];                                                                          \
    for (int i = 0; i < MRK; i++) ar[i] = a + (i < mr ? i : mr - 1) * lda;                     \
    F(vec) acc[MRK][NV];                                                                       \
    for (int i = 0; i < MRK; i++)                                                              \
      for (int v = 0; v < NV; v++) acc[i][v] = (F(vec)){0};                                    \
    for (int64_t p = 0; p < kc; p++) {                                                         \
      F(vec) bv[NV];                                                                           \
      for (int v = 0; v < NV; v++) bv[v] = *(const F(uvec) *)(b + p * ldb + v * VL);          \
      _Pragma("GCC unroll 16") for (int i = 0; i < MRK; i++) {                                 \
        T av = ar[i][p];                                                                       \
        for (int v = 0; v < NV; v++) acc[i][v] += av * bv[v];                                  \
      }                                                                                        \
    }                                                                                          \
    PPCC_KERNEL_STORE(MRK, NV)                                                                 \
  }

PPCC_KERNEL(F(kernel_big), PPCC_MR_BIG, 2)
PPCC_KERNEL(F(kernel_small), PPCC_MR_SMALL, 2)
PPCC_KERNEL(F(kernel_big_half), PPCC_MR_BIG, 1)
PPCC_KERNEL(F(kernel_small_half), PPCC_MR_SMALL, 1)
PPCC_KERNEL_DIRECT(F(kernel_direct), PPCC_MR_SMALL, 2)
PPCC_KERNEL_DIRECT(F(kernel_direct_half), PPCC_MR_SMALL, 1)

typedef void (*F(kernel_fn))(int64_t, const T *restrict, const T *restrict, T *restrict, int64_t,
                             int64_t, int64_t, T, T, int);

/* Pack rows [0, mc) x k [0, kc) of A (element (i, p) at a[i*rsa + p*csa]) into MR-row
 * panels: panel r holds a[(r*MR + i), p] at out[r*MR*kc + p*MR + i], zero-padded rows. */
static void F(pack_a)(int64_t mc, int64_t kc, const T *a, int64_t rsa, int64_t csa, T *out,
                      int mrk) {
#if defined(__AVX512F__)
  if (sizeof(T) == 4 && csa == 1 && mrk <= 16) {
    for (int64_t i0 = 0; i0 < mc; i0 += mrk) {
      int rows = (int)(mc - i0 < mrk ? mc - i0 : mrk);
      for (int64_t p0 = 0; p0 < kc; p0 += 16)
        ppcc_tr16((const float *)(a + i0 * rsa + p0), rsa, rows, (int)(kc - p0 < 16 ? kc - p0 : 16),
                  (float *)(out + i0 * kc + p0 * mrk), mrk, mrk);
    }
    return;
  }
#endif
  for (int64_t i0 = 0; i0 < mc; i0 += mrk) {
    int64_t mr = mc - i0 < mrk ? mc - i0 : mrk;
    T *o = out + i0 * kc;
    for (int64_t p = 0; p < kc; p++) {
      const T *src = a + i0 * rsa + p * csa;
      int64_t i = 0;
      for (; i < mr; i++) o[p * mrk + i] = src[i * rsa];
      for (; i < mrk; i++) o[p * mrk + i] = 0;
    }
  }
}

/* Pack k [0, kc) x columns [0, nc) of B (element (p, j) at b[p*rsb + j*csb]) into
 * NR-column panels: panel q holds b[p, q*NR + j] at out[q*NR*kc + p*NR + j], zero-padded. */
static void F(pack_b)(int64_t kc, int64_t nc, const T *b, int64_t rsb, int64_t csb, T *out) {
  int64_t nfull = nc / NR * NR;
  if (csb == 1) {
    for (int64_t p = 0; p < kc; p++) {
      const T *src = b + p * rsb;
      for (int64_t j0 = 0; j0 < nfull; j0 += NR) {
        T *o = out + j0 * kc + p * NR;
        *(F(vec) *)o = *(const F(uvec) *)(src + j0);
        *(F(vec) *)(o + VL) = *(const F(uvec) *)(src + j0 + VL);
      }
    }
  } else {
#if defined(__AVX512F__)
    if (sizeof(T) == 4 && rsb == 1 && NR == 32) {
      for (int64_t j0 = 0; j0 < nc; j0 += NR)
        for (int h = 0; h < 2; h++) {
          int64_t rows = nc - j0 - h * 16;
          rows = rows < 0 ? 0 : rows > 16 ? 16 : rows;
          for (int64_t p0 = 0; p0 < kc; p0 += 16)
            ppcc_tr16((const float *)(b + (j0 + h * 16) * csb + p0), csb, (int)rows,
                      (int)(kc - p0 < 16 ? kc - p0 : 16), (float *)(out + j0 * kc + p0 * NR + h * 16),
                      NR, 16);
        }
      return;
    }
#endif
    for (int64_t j0 = 0; j0 < nfull; j0 += NR) {
      T *o = out + j0 * kc;
      for (int64_t j = 0; j < NR; j++) {
        const T *src = b + (j0 + j) * csb;
        for (int64_t p = 0; p < kc; p++) o[p * NR + j] = src[p * rsb];
      }
    }
  }
  if (nfull < nc) {
    T *o = out + nfull * kc;
    for (int64_t p = 0; p < kc; p++) {
      int64_t j = 0;
      for (; j < nc - nfull; j++) o[p * NR + j] = b[p * rsb + (nfull + j) * csb];
      for (; j < NR; j++) o[p * NR + j] = 0;
    }
  }
}

/* gemm_serial for a row-major A (row stride lda) and k <= KC: the direct kernels on
 * MR_SMALL-row strips of A, unpacked, and NR-column strips of B, read in place when B is
 * row-major and the strip is as wide as its kernel, else packed into the workspace
 * (transposed B, or a narrower last strip, zero-padded). */
static int F(gemm_direct)(int64_t m, int64_t n, int64_t k, T alpha, const T *a, int64_t lda,
                          const T *b, int64_t rsb, int64_t csb, T beta, int has_c, T *c,
                          int64_t ldc, ppcc_ws *ws) {
  int mode = has_c ? F(BETA) : F(SET);
  const int mr_k = PPCC_MR_SMALL;
  for (int64_t jr = 0; jr < n; jr += NR) {
    int64_t nr = n - jr < NR ? n - jr : NR;
    int half = nr <= VL;
    const T *bp = b + jr * csb;
    int64_t ldbp = rsb;
    if (csb != 1 || nr != (half ? VL : NR)) {
      T *t = (T *)ppcc_reserve(&ws->b, &ws->bcap, sizeof(T) * (size_t)(k * NR));
      if (!t) return -1;
      F(pack_b)(k, nr, b + jr * csb, rsb, csb, t);
      bp = t;
      ldbp = NR;
    }
    for (int64_t ir = 0; ir < m; ir += mr_k) {
      int64_t mr = m - ir < mr_k ? m - ir : mr_k;
      (half ? F(kernel_direct_half) : F(kernel_direct))(k, a + ir * lda, lda, bp, ldbp,
                                                       c + ir * ldc + jr, ldc, mr, nr, alpha,
                                                       beta, mode);
    }
  }
  return 0;
}

/* One thread's GEMM on a dense row-major C: c = alpha * op(a) op(b) (+ beta * c when
 * `has_c`). Returns 0, or -1 when the packing buffers could not be allocated. */
static int F(gemm_serial)(int64_t m, int64_t n, int64_t k, T alpha, const T *a, int64_t rsa,
                          int64_t csa, const T *b, int64_t rsb, int64_t csb, T beta, int has_c,
                          T *c, int64_t ldc, ppcc_ws *ws) {
  if (m <= 0 || n <= 0) return 0;
  if (k <= 0) {
    /* An empty sum, times alpha (0 · alpha is NaN for a non-finite alpha), plus beta · C. */
    T z = (T)0 * alpha;
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) c[i * ldc + j] = has_c ? z + beta * c[i * ldc + j] : z;
    return 0;
  }
  /* Small products of row-major operands: no packing at all. Packing pays for itself by
   * streaming large blocks through the caches; for a B of at most 64K elements (and one
   * block of k) it is most of the work (GPT-sized layers: k = 32, n = 96). */
  if (csa == 1 && k <= KC && k * n <= 65536)
    return F(gemm_direct)(m, n, k, alpha, a, rsa, b, rsb, csb, beta, has_c, c, ldc, ws);
  /* The smaller padding of m wins (both kernels run at about the same speed). */
  int mrk = PPCC_MR_BIG;
  F(kernel_fn) kern = F(kernel_big), kern_half = F(kernel_big_half);
  int64_t pad_big = (m + PPCC_MR_BIG - 1) / PPCC_MR_BIG * PPCC_MR_BIG;
  int64_t pad_small = (m + PPCC_MR_SMALL - 1) / PPCC_MR_SMALL * PPCC_MR_SMALL;
  if (pad_small < pad_big) {
    mrk = PPCC_MR_SMALL;
    kern = F(kernel_small);
    kern_half = F(kernel_small_half);
  }
  int64_t kcmax = k < KC ? k : KC, ncmax = n < NC ? n : NC, mcmax = m < MC ? m : MC;
  size_t bneed = sizeof(T) * (size_t)(kcmax * ((ncmax + NR - 1) / NR * NR));
  size_t aneed = sizeof(T) * (size_t)(kcmax * ((mcmax + mrk - 1) / mrk * mrk));
  T *bp = (T *)ppcc_reserve(&ws->b, &ws->bcap, bneed);
  T *ap = (T *)ppcc_reserve(&ws->a, &ws->acap, aneed);
  if (!bp || !ap) return -1;
  for (int64_t jc = 0; jc < n; jc += NC) {
    int64_t nc = n - jc < NC ? n - jc : NC;
    for (int64_t pc = 0; pc < k; pc += KC) {
      int64_t kc = k - pc < KC ? k - pc : KC;
      int mode = pc > 0 ? F(ADD) : has_c ? F(BETA) : F(SET);
      F(pack_b)(kc, nc, b + pc * rsb + jc * csb, rsb, csb, bp);
      for (int64_t ic = 0; ic < m; ic += MC) {
        int64_t mc = m - ic < MC ? m - ic : MC;
        F(pack_a)(mc, kc, a + ic * rsa + pc * csa, rsa, csa, ap, mrk);
        for (int64_t ir = 0; ir < mc; ir += mrk) {
          int64_t mr = mc - ir < mrk ? mc - ir : mrk;
          for (int64_t jr = 0; jr < nc; jr += NR) {
            int64_t nr = nc - jr < NR ? nc - jr : NR;
            (nr > VL ? kern : kern_half)(kc, ap + ir * kc, bp + jr * kc,
                                         c + (ic + ir) * ldc + jc + jr, ldc, mr, nr, alpha, beta,
                                         mode);
          }
        }
      }
    }
  }
  return 0;
}

/* The same product without packing buffers (the fallback when they cannot be allocated). */
static void F(gemm_naive)(int64_t m, int64_t n, int64_t k, T alpha, const T *a, int64_t rsa,
                          int64_t csa, const T *b, int64_t rsb, int64_t csb, T beta, int has_c, T *c,
                          int64_t ldc) {
  for (int64_t i = 0; i < m; i++)
    for (int64_t j = 0; j < n; j++) {
      T acc = 0;
      for (int64_t p = 0; p < k; p++) acc += a[i * rsa + p * csa] * b[p * rsb + j * csb];
      c[i * ldc + j] = alpha * acc + (has_c ? beta * c[i * ldc + j] : 0);
    }
}

typedef struct {
  int64_t m, n, k;
  T alpha, beta;
  const T *a, *b;
  int64_t rsa, csa, rsb, csb, ldc;
  int has_c;
  T *c;
  int rc;
} F(part);

static void *F(run_part)(void *arg) {
  F(part) *p = (F(part) *)arg;
  ppcc_ws *ws = ppcc_ws_acquire();
  p->rc = !ws || F(gemm_serial)(p->m, p->n, p->k, p->alpha, p->a, p->rsa, p->csa, p->b, p->rsb,
                                p->csb, p->beta, p->has_c, p->c, p->ldc, ws);
  ppcc_ws_release(ws);
  if (p->rc)
    F(gemm_naive)(p->m, p->n, p->k, p->alpha, p->a, p->rsa, p->csa, p->b, p->rsb, p->csb, p->beta,
                  p->has_c, p->c, p->ldc);
  return NULL;
}

/* C (m x n, row-major, row stride ldc) = alpha * op(A) op(B) [+ beta * C0].
 *   flags bit 0: op(A) = A^T (A stored k x m, row stride lda), else A is m x k;
 *   flags bit 1: op(B) = B^T (B stored n x k, row stride ldb), else B is k x n;
 *   c0: NULL, or C0 broadcast to m x n: element (i, j) at c0[i*c0_rs + j*c0_cs] (strides 0
 *       along broadcast dimensions). With C0, beta * C0 is added even when beta is 0 (so
 *       non-finite values propagate, as the interpreter computes it).
 * Accumulation is in T. */
void PPCC_CAT(PPCC_CAT(ppcc_, PPCC_S), gemm)(int64_t flags, int64_t m, int64_t n, int64_t k, T alpha, const T *a, int64_t lda,
                 const T *b, int64_t ldb, T beta, const T *c0, int64_t c0_rs, int64_t c0_cs, T *c,
                 int64_t ldc) {
  int64_t rsa = flags & 1 ? 1 : lda, csa = flags & 1 ? lda : 1;
  int64_t rsb = flags & 2 ? 1 : ldb, csb = flags & 2 ? ldb : 1;
  int has_c = c0 != NULL;
  if (has_c && c0 != c) {
    for (int64_t i = 0; i < m; i++)
      for (int64_t j = 0; j < n; j++) c[i * ldc + j] = c0[i * c0_rs + j * c0_cs];
  }
  int threads = ppcc_get_num_threads();
  double flops = 2.0 * (double)m * (double)n * (double)k;
  /* Enough work per thread to repay starting it (about 4 MFLOP). */
  if (threads > 1 && flops / threads < 4e6) threads = (int)(flops / 4e6);
  if (threads <= 1) {
    ppcc_ws *ws = ppcc_ws_acquire();
    if (!ws || F(gemm_serial)(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, has_c, c, ldc, ws))
      F(gemm_naive)(m, n, k, alpha, a, rsa, csa, b, rsb, csb, beta, has_c, c, ldc);
    ppcc_ws_release(ws);
    return;
  }
  /* Split the larger side of C, in whole tiles, into `threads` parts. */
  int split_n = (n + NR - 1) / NR >= (m + PPCC_MR_BIG - 1) / PPCC_MR_BIG;
  int64_t unit = split_n ? NR : PPCC_MR_BIG, len = split_n ? n : m;
  int64_t units = (len + unit - 1) / unit;
  if (threads > units) threads = (int)units;
  F(part) parts[threads];
  pthread_t tids[threads];
  int started[threads];
  for (int t = 0; t < threads; t++) {
    int64_t lo = units * t / threads * unit, hi = units * (t + 1) / threads * unit;
    if (hi > len) hi = len;
    F(part) *p = &parts[t];
    *p = (F(part)){m, n, k, alpha, beta, a, b, rsa, csa, rsb, csb, ldc, has_c, c, 0};
    if (split_n) {
      p->n = hi - lo;
      p->b = b + lo * csb;
      p->c = c + lo;
    } else {
      p->m = hi - lo;
      p->a = a + lo * rsa;
      p->c = c + lo * ldc;
    }
    started[t] = t > 0 && pthread_create(&tids[t], NULL, F(run_part), p) == 0;
  }
  F(run_part)(&parts[0]);
  for (int t = 1; t < threads; t++) {
    if (started[t])
      pthread_join(tids[t], NULL);
    else
      F(run_part)(&parts[t]);
  }
}

/* `count` products C_i = alpha * op(A_i) op(B_i) [+ beta * C_i] with X_i = x + i * stride_x
 * (stride 0: the same matrix for every i); with beta 0, C_i is written and not read. The
 * strided-batched GEMM of BLAS libraries: the form the CUDA target hands to cuBLAS
 * (`--gpu-gemm cublas`), which CPU builds of that form run here. */
void PPCC_CAT(PPCC_CAT(ppcc_, PPCC_S), gemm_batched)(int64_t flags, int64_t m, int64_t n, int64_t k,
                                                    T alpha, const T *a, int64_t lda,
                                                    int64_t stride_a, const T *b, int64_t ldb,
                                                    int64_t stride_b, T beta, T *c, int64_t ldc,
                                                    int64_t stride_c, int64_t count) {
  for (int64_t i = 0; i < count; i++) {
    T *ci = c + i * stride_c;
    PPCC_CAT(PPCC_CAT(ppcc_, PPCC_S), gemm)(flags, m, n, k, alpha, a + i * stride_a, lda,
                                            b + i * stride_b, ldb, beta, beta != 0 ? ci : NULL,
                                            ldc, 1, ci, ldc);
  }
}

#undef T
#undef F
#undef VL
#undef NR
#undef KC
#undef NC
#undef MC

#endif /* PPCC_T */
