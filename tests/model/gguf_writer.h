/*
 * A minimal GGUF v3 writer for tests and fuzz corpora only: builds the file in
 * memory (metadata, tensor infos, aligned data) and writes it out. It can be
 * told to write wrong things (version, counts) to exercise the reader's checks.
 */
#ifndef NL_TEST_GGUF_WRITER_H
#define NL_TEST_GGUF_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "nl_model.h"

struct gw;

struct gw *gw_new(void);
void gw_free(struct gw *g);
void gw_kv_str(struct gw *g, const char *key, const char *value);
void gw_kv_u32(struct gw *g, const char *key, uint32_t value);
void gw_kv_f32(struct gw *g, const char *key, float value);
void gw_kv_arr_str(struct gw *g, const char *key, const char *const *values, uint32_t n);
void gw_kv_arr_f32(struct gw *g, const char *key, const float *values, uint32_t n);
void gw_kv_arr_i32(struct gw *g, const char *key, const int32_t *values, uint32_t n);
/* Tensor of n_dims dims ne[] (fastest first) with raw bytes in ggml type `type`. */
void gw_tensor_raw(struct gw *g, const char *name, uint32_t n_dims, const uint64_t *ne,
		   uint32_t type, const void *data, size_t bytes);
/* Replaces (same position) or removes the tensor called name. */
void gw_replace_tensor(struct gw *g, const char *name, uint32_t n_dims, const uint64_t *ne,
		       uint32_t type, const void *data, size_t bytes);
void gw_remove_tensor(struct gw *g, const char *name);
/* Encodes n floats (rows of ne[0]) as F32 (0), F16 (1), Q8_0 (8) or BF16 (30). */
void gw_tensor(struct gw *g, const char *name, uint32_t n_dims, const uint64_t *ne,
	       uint32_t type, const float *data);
/* Serialises the whole file; *size bytes, caller frees. */
uint8_t *gw_bytes(struct gw *g, uint32_t version, uint32_t alignment, size_t *size);
int gw_write(struct gw *g, const char *path);

/* The llama metadata and tensors of a loaded model; matrices in `matrix_type`
 * (rows whose length is not a multiple of 32 stay F32 for Q8_0). */
struct gw *gw_from_model(const struct nl_model *m, uint32_t matrix_type);

/* ggml's reference encodings. */
uint16_t gw_f32_to_bf16(float f);
void gw_quantize_q8_0(const float *x, size_t n, uint8_t *out);

#endif
