/* A pass plugin in C, for the lit tests of ppcc's plugin loader: one working pass and
 * passes that misbehave in every way the loader must report. Built by the tests with
 * `%cc -shared -fPIC -I%abi-include`; -DDEFECT_... variants break the descriptor. */
#include <stdlib.h>
#include <string.h>

#include "ppcc_plugin.h"

static int32_t reply(PpccBuffer *out, const char *text, size_t len, int32_t status) {
  out->ptr = malloc(len ? len : 1);
  memcpy(out->ptr, text, len);
  out->len = len;
  return status;
}

/* c-identity: returns the module unchanged. */
static int32_t identity(PpccBytes module, PpccBytes options, PpccBuffer *out) {
  (void)options;
  return reply(out, (const char *)module.ptr, module.len, PPCC_STATUS_OK);
}

/* c-fail: refuses, echoing its options. */
static int32_t fail(PpccBytes module, PpccBytes options, PpccBuffer *out) {
  (void)module;
  char msg[256] = "the C pass refuses (options: ";
  size_t n = strlen(msg);
  size_t k = options.len < 200 ? options.len : 200;
  memcpy(msg + n, options.ptr, k);
  memcpy(msg + n + k, ")", 2);
  return reply(out, msg, strlen(msg), PPCC_STATUS_FAILED);
}

/* c-garbage: claims success but returns text that is not ppir. */
static int32_t garbage(PpccBytes module, PpccBytes options, PpccBuffer *out) {
  (void)module, (void)options;
  static const char text[] = "this is not ppir";
  return reply(out, text, sizeof text - 1, PPCC_STATUS_OK);
}

/* c-unverified: returns a module that parses but does not verify. */
static int32_t unverified(PpccBytes module, PpccBytes options, PpccBuffer *out) {
  (void)module, (void)options;
  static const char text[] =
      "module {\n"
      "  func @main(%x: tensor<2x3xf32>) -> (tensor<3x2xf32>) {\n"
      "    %t = \"pp.transpose\"(%x) {perm = \"1,0\"} : (tensor<2x3xf32>) -> tensor<3x2xf32>\n"
      "    return %t : tensor<3x2xf32>\n"
      "  }\n"
      "}\n";
  return reply(out, text, sizeof text - 1, PPCC_STATUS_OK);
}

/* c-panicked: reports what a caught panic (or C++ exception) reports. */
static int32_t panicked(PpccBytes module, PpccBytes options, PpccBuffer *out) {
  (void)module, (void)options;
  static const char text[] = "caught: index 3 out of range\n";
  return reply(out, text, sizeof text - 1, PPCC_STATUS_PANICKED);
}

/* c-status: returns a status the ABI does not define. */
static int32_t status(PpccBytes module, PpccBytes options, PpccBuffer *out) {
  (void)module, (void)options;
  out->ptr = NULL;
  out->len = 0;
  return 7;
}

/* c-crash: a bug that ends the process (a write through a null pointer). */
static int32_t crash(PpccBytes module, PpccBytes options, PpccBuffer *out) {
  (void)module, (void)options, (void)out;
  volatile int *p = NULL;
  *p = 1;
  return PPCC_STATUS_OK;
}

static void free_buffer(PpccBuffer b) { free(b.ptr); }

static const PpccPassDescriptor passes[] = {
    {"c-identity", "return the module unchanged", identity},
    {"c-fail", "always fail", fail},
    {"c-garbage", "return text that is not ppir", garbage},
    {"c-unverified", "return a module that does not verify", unverified},
    {"c-panicked", "report a caught panic", panicked},
    {"c-status", "return status 7", status},
    {"c-crash", "write through a null pointer", crash},
#ifdef DEFECT_DUPLICATE
    {"c-fail", "a second c-fail", fail},
#endif
#ifdef DEFECT_BUILTIN_NAME
    {"canonicalize", "a pass named like a built-in one", identity},
#endif
#ifdef DEFECT_BAD_NAME
    {"c fail{x}", "a pass name with spaces and braces", fail},
#endif
#ifdef DEFECT_NO_RUN
    {"c-no-run", "a pass without a function", NULL},
#endif
};

static const PpccPluginDescriptor descriptor = {
#ifdef DEFECT_ABI
    99,
#else
    PPCC_PLUGIN_ABI_VERSION,
#endif
    "c-test",
    "0.1",
#ifdef DEFECT_NO_FREE
    NULL,
#else
    free_buffer,
#endif
    passes,
    sizeof passes / sizeof passes[0],
};

const PpccPluginDescriptor *ppcc_pass_plugin(void) {
#ifdef DEFECT_NULL
  return NULL;
#else
  return &descriptor;
#endif
}
