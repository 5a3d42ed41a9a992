/* The ppcc pass-plugin ABI, version 1, for plugins written in C (or anything with a C ABI).
 *
 * The same types as the Rust crate ppcc-plugin (plugin/src/abi.rs), which is the reference;
 * docs/plugins.md describes the contract. A plugin exports
 *
 *     const PpccPluginDescriptor *ppcc_pass_plugin(void);
 *
 * returning a descriptor that lives as long as the library. ppcc reads `abi_version` first
 * and loads only PPCC_PLUGIN_ABI_VERSION. Each pass gets the module as ppir text and its
 * options as `key=value,...`, and writes the new module text (PPCC_STATUS_OK) or an error
 * message (PPCC_STATUS_FAILED) into `*out`, in memory that `free_buffer` releases. Nothing
 * may unwind (C++ exceptions included) out of these functions. */
#ifndef PPCC_PLUGIN_H
#define PPCC_PLUGIN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define PPCC_PLUGIN_ABI_VERSION 1u

#define PPCC_STATUS_OK 0
#define PPCC_STATUS_FAILED 1
#define PPCC_STATUS_PANICKED 2

/* Borrowed bytes, valid during the call. */
typedef struct {
  const uint8_t *ptr;
  size_t len;
} PpccBytes;

/* Bytes the plugin allocated; ppcc hands them back to free_buffer. */
typedef struct {
  uint8_t *ptr;
  size_t len;
} PpccBuffer;

typedef int32_t (*PpccRunPassFn)(PpccBytes module, PpccBytes options, PpccBuffer *out);
typedef void (*PpccFreeBufferFn)(PpccBuffer buffer);

typedef struct {
  const char *name;        /* NUL-terminated; A-Z a-z 0-9 - _ . */
  const char *description; /* one line, NUL-terminated */
  PpccRunPassFn run;
} PpccPassDescriptor;

typedef struct {
  uint32_t abi_version; /* PPCC_PLUGIN_ABI_VERSION; the first field in every version */
  const char *name;
  const char *version;
  PpccFreeBufferFn free_buffer;
  const PpccPassDescriptor *passes;
  size_t num_passes;
} PpccPluginDescriptor;

const PpccPluginDescriptor *ppcc_pass_plugin(void);

#ifdef __cplusplus
}
#endif

#endif /* PPCC_PLUGIN_H */
