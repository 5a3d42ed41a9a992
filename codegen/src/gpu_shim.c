/* The host side of a CUDA stage module: MLIR's GPU runtime ABI (the `mgpu*` functions that
 * the `gpu-to-llvm` lowering calls) and the allocator the module's host code calls for its
 * temporaries, forwarded to the ppcc runtime through a table of functions that the runtime
 * installs right after loading the module (`ppcc_gpu_set_api`). The module itself links
 * nothing of CUDA: the runtime owns the driver (loaded at run time), the contexts, the
 * streams and every allocation, so a module builds, loads and is inspected on machines
 * without a GPU.
 *
 * The layout of `ppcc_gpu_api` is the contract with `ppcc-runtime` (`runtime/src/gpu.rs`,
 * `GpuApi`); `PPCC_GPU_API_VERSION` changes with it.
 *
 * Kernel images: with `format=isa` the host code calls `mgpuModuleLoadJIT(ptx, opt)` from
 * a global constructor, i.e. while the module is being loaded and before the runtime has
 * installed its table. The handle returned is therefore the image itself (NUL-terminated
 * PTX in the module's read-only data); the runtime loads it into the calling thread's
 * context on first use and caches it per context (`get_function`). */
#include <stddef.h>
#include <stdint.h>

#define PPCC_GPU_API_VERSION 2u

typedef struct {
  uint32_t version;
  uint32_t size;
  /* The kernel `name` of the NUL-terminated PTX `image`, loaded in the current context. */
  void *(*get_function)(const void *image, const char *name);
  void (*launch)(void *function, int64_t gx, int64_t gy, int64_t gz, int64_t bx, int64_t by,
                 int64_t bz, int32_t shared_bytes, void *stream, void **params, void **extra,
                 int64_t nparams);
  void *(*stream_create)(void);
  void (*stream_destroy)(void *stream);
  void (*stream_synchronize)(void *stream);
  /* Memory the device and the host can both address (the host code of a module reads
   * and writes its buffers too: copies, send and receive). */
  void *(*alloc)(uint64_t bytes);
  void (*free)(void *ptr);
  void (*memcpy)(void *dst, const void *src, uint64_t bytes, void *stream);
  void (*memset32)(void *dst, uint32_t value, uint64_t count, void *stream);
  void (*memset16)(void *dst, uint16_t value, uint64_t count, void *stream);
  /* Matrix products (`--gpu-gemm cublas`): `ppcc_sgemm`'s row-major contract
   * (ppcc_support.h) on device buffers, with C0 NULL or C itself; complete on return. */
  void (*sgemm)(int64_t flags, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                int64_t lda, const float *b, int64_t ldb, float beta, const float *c0,
                int64_t c0_rs, int64_t c0_cs, float *c, int64_t ldc);
  void (*dgemm)(int64_t flags, int64_t m, int64_t n, int64_t k, double alpha, const double *a,
                int64_t lda, const double *b, int64_t ldb, double beta, const double *c0,
                int64_t c0_rs, int64_t c0_cs, double *c, int64_t ldc);
  /* `ppcc_sgemm_batched`'s contract (ppcc_support.h): `count` products at strides. */
  void (*sgemm_batched)(int64_t flags, int64_t m, int64_t n, int64_t k, float alpha,
                        const float *a, int64_t lda, int64_t stride_a, const float *b,
                        int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc,
                        int64_t stride_c, int64_t count);
  void (*dgemm_batched)(int64_t flags, int64_t m, int64_t n, int64_t k, double alpha,
                        const double *a, int64_t lda, int64_t stride_a, const double *b,
                        int64_t ldb, int64_t stride_b, double beta, double *c, int64_t ldc,
                        int64_t stride_c, int64_t count);
} ppcc_gpu_api;

static const ppcc_gpu_api *ppcc_gpu;

/* 0 when the table is accepted, -1 when it is missing or of another version. */
int32_t ppcc_gpu_set_api(const ppcc_gpu_api *api) {
  if (!api || api->version != PPCC_GPU_API_VERSION || api->size < sizeof(ppcc_gpu_api))
    return -1;
  ppcc_gpu = api;
  return 0;
}

uint32_t ppcc_gpu_api_version(void) { return PPCC_GPU_API_VERSION; }

/* ---- modules and kernels ---- */

void *mgpuModuleLoadJIT(void *data, int32_t opt_level) {
  (void)opt_level;
  return data;
}

void *mgpuModuleLoad(void *data, size_t size) {
  (void)size;
  return data;
}

void mgpuModuleUnload(void *module) { (void)module; }

void *mgpuModuleGetFunction(void *module, const char *name) {
  return ppcc_gpu ? ppcc_gpu->get_function(module, name) : NULL;
}

void mgpuLaunchKernel(void *function, int64_t gx, int64_t gy, int64_t gz, int64_t bx, int64_t by,
                      int64_t bz, int32_t shared_bytes, void *stream, void **params, void **extra,
                      int64_t nparams) {
  if (ppcc_gpu)
    ppcc_gpu->launch(function, gx, gy, gz, bx, by, bz, shared_bytes, stream, params, extra,
                     nparams);
}

/* ---- streams and events (events order work on the one stream: nothing to do) ---- */

void *mgpuStreamCreate(void) { return ppcc_gpu ? ppcc_gpu->stream_create() : NULL; }

void mgpuStreamDestroy(void *stream) {
  if (ppcc_gpu)
    ppcc_gpu->stream_destroy(stream);
}

void mgpuStreamSynchronize(void *stream) {
  if (ppcc_gpu)
    ppcc_gpu->stream_synchronize(stream);
}

void mgpuStreamWaitEvent(void *stream, void *event) {
  (void)stream;
  (void)event;
}

void *mgpuEventCreate(void) { return (void *)1; }
void mgpuEventDestroy(void *event) { (void)event; }
void mgpuEventSynchronize(void *event) { (void)event; }
void mgpuEventRecord(void *event, void *stream) {
  (void)event;
  (void)stream;
}

/* ---- memory ---- */

void *mgpuMemAlloc(uint64_t bytes, void *stream, int8_t host_shared) {
  (void)stream;
  (void)host_shared;
  return ppcc_gpu ? ppcc_gpu->alloc(bytes) : NULL;
}

void mgpuMemFree(void *ptr, void *stream) {
  (void)stream;
  if (ppcc_gpu)
    ppcc_gpu->free(ptr);
}

void mgpuMemcpy(void *dst, void *src, size_t bytes, void *stream) {
  if (ppcc_gpu)
    ppcc_gpu->memcpy(dst, src, bytes, stream);
}

void mgpuMemset32(void *dst, uint32_t value, size_t count, void *stream) {
  if (ppcc_gpu)
    ppcc_gpu->memset32(dst, value, count, stream);
}

void mgpuMemset16(void *dst, uint16_t value, size_t count, void *stream) {
  if (ppcc_gpu)
    ppcc_gpu->memset16(dst, value, count, stream);
}

/* The module's host code allocates its temporaries here (codegen renames its `malloc`,
 * `aligned_alloc` and `free`): kernels read and write them. */
void *ppcc_gpu_malloc(size_t bytes) { return ppcc_gpu ? ppcc_gpu->alloc(bytes) : NULL; }

void *ppcc_gpu_aligned_alloc(size_t alignment, size_t bytes) {
  (void)alignment; /* device allocations are aligned to at least 256 bytes */
  return ppcc_gpu ? ppcc_gpu->alloc(bytes) : NULL;
}

void ppcc_gpu_free(void *ptr) {
  if (ppcc_gpu && ptr)
    ppcc_gpu->free(ptr);
}

/* ---- matrix products (`--gpu-gemm cublas`: the CUDA pipeline renames the library
 * versions' `ppcc_sgemm`/`ppcc_dgemm` calls to these; the module also links the CPU's
 * support library, whose names they must not take) ---- */

void ppcc_gpu_sgemm(int64_t flags, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                    int64_t lda, const float *b, int64_t ldb, float beta, const float *c0,
                    int64_t c0_rs, int64_t c0_cs, float *c, int64_t ldc) {
  if (ppcc_gpu)
    ppcc_gpu->sgemm(flags, m, n, k, alpha, a, lda, b, ldb, beta, c0, c0_rs, c0_cs, c, ldc);
}

void ppcc_gpu_dgemm(int64_t flags, int64_t m, int64_t n, int64_t k, double alpha,
                    const double *a, int64_t lda, const double *b, int64_t ldb, double beta,
                    const double *c0, int64_t c0_rs, int64_t c0_cs, double *c, int64_t ldc) {
  if (ppcc_gpu)
    ppcc_gpu->dgemm(flags, m, n, k, alpha, a, lda, b, ldb, beta, c0, c0_rs, c0_cs, c, ldc);
}

void ppcc_gpu_sgemm_batched(int64_t flags, int64_t m, int64_t n, int64_t k, float alpha,
                            const float *a, int64_t lda, int64_t stride_a, const float *b,
                            int64_t ldb, int64_t stride_b, float beta, float *c, int64_t ldc,
                            int64_t stride_c, int64_t count) {
  if (ppcc_gpu)
    ppcc_gpu->sgemm_batched(flags, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c,
                            ldc, stride_c, count);
}

void ppcc_gpu_dgemm_batched(int64_t flags, int64_t m, int64_t n, int64_t k, double alpha,
                            const double *a, int64_t lda, int64_t stride_a, const double *b,
                            int64_t ldb, int64_t stride_b, double beta, double *c, int64_t ldc,
                            int64_t stride_c, int64_t count) {
  if (ppcc_gpu)
    ppcc_gpu->dgemm_batched(flags, m, n, k, alpha, a, lda, stride_a, b, ldb, stride_b, beta, c,
                            ldc, stride_c, count);
}
