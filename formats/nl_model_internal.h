/*
 * Internals shared by the checkpoint readers (nl_llama2c.c, nl_gguf.c),
 * nl_model.c and nl_vocab.c. Not installed; the fuzz targets and tests use the
 * in-memory parsers declared here.
 */
#ifndef NL_MODEL_INTERNAL_H
#define NL_MODEL_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "nl_model.h"

/* Upper bounds that keep a hostile header from asking for absurd allocations. */
#define NL_MODEL_MAX_DIM (1u << 20)
#define NL_MODEL_MAX_VOCAB (1u << 24)
#define NL_MODEL_MAX_SEQ (1u << 24)
#define NL_MODEL_MAX_HEADS 4096u

struct nl_model {
	struct nl_model_config config;
	struct nl_model_weights weights;
	struct nl_layer_weights *layers;  /* [n_layers], weights.layers points here */
	float *arena;                     /* every F32 weight, one allocation */
	size_t arena_floats;
};

/* ---- shared little helpers ---- */

static inline uint16_t nl_le16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static inline uint32_t nl_le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t nl_le64(const uint8_t *p)
{
	return (uint64_t)nl_le32(p) | (uint64_t)nl_le32(p + 4) << 32;
}

float nl_f16_to_f32(uint16_t h);
uint16_t nl_f32_to_f16(float f);        /* round to nearest even */
float nl_bf16_to_f32(uint16_t h);
/* n little-endian F32 values into dst (handles unaligned sources). */
void nl_load_f32_le(float *dst, const uint8_t *src, size_t n);

/* Maps a whole file read-only; *size may be 0 (then *map is NULL). */
int nl_map_file(const char *path, const uint8_t **map, size_t *size);
void nl_unmap_file(const uint8_t *map, size_t size);

/* Derived from a path: the last component without its extension. */
void nl_model_stem(char *dst, size_t size, const char *path);

/*
 * Allocates m->arena for `floats` floats and m->layers for the config's layer
 * count; config must be filled and validated.
 */
int nl_model_alloc(struct nl_model *m, size_t floats);
/* Checks the hyper-parameters are sane (positive, divisible, bounded). */
int nl_model_check_config(const struct nl_model_config *c, const char *what);

/* ---- llama2.c ---- */

/* Parses a llama2.c checkpoint held in memory into m (zeroed by the caller). */
int nl_llama2c_parse(struct nl_model *m, const char *what, const uint8_t *data, size_t size);

/* ---- GGUF ---- */

enum nl_gguf_type {
	NL_GGUF_U8 = 0, NL_GGUF_I8 = 1, NL_GGUF_U16 = 2, NL_GGUF_I16 = 3,
	NL_GGUF_U32 = 4, NL_GGUF_I32 = 5, NL_GGUF_F32 = 6, NL_GGUF_BOOL = 7,
	NL_GGUF_STRING = 8, NL_GGUF_ARRAY = 9, NL_GGUF_U64 = 10, NL_GGUF_I64 = 11,
	NL_GGUF_F64 = 12,
};

/* ggml tensor types this reader knows. */
enum nl_ggml_type {
	NL_GGML_F32 = 0,
	NL_GGML_F16 = 1,
	NL_GGML_Q8_0 = 8,
	NL_GGML_BF16 = 30,
};

struct nl_gguf_kv {
	const uint8_t *key;
	uint64_t key_len;
	uint32_t type;          /* enum nl_gguf_type */
	const uint8_t *value;   /* scalar or string (u64 length + bytes) */
	uint32_t arr_type;      /* arrays: element type */
	uint64_t arr_count;
	const uint8_t *arr_data;  /* first element */
};

struct nl_gguf_tensor {
	char name[96];
	uint32_t n_dims;
	uint64_t ne[4];         /* fastest-varying first */
	uint32_t type;          /* enum nl_ggml_type */
	uint64_t offset;        /* relative to the data section */
	uint64_t n_elems;
	uint64_t n_bytes;
	const uint8_t *data;
};

struct nl_gguf {
	const char *what;       /* file name for diagnostics */
	const uint8_t *base;
	size_t size;
	uint32_t version;
	uint64_t n_kv;
	uint64_t n_tensors;
	struct nl_gguf_kv *kv;
	struct nl_gguf_tensor *tensors;
	struct nl_gguf_tensor **by_name;  /* sorted by name */
	uint32_t alignment;
	uint64_t data_offset;
};

/* Parses header, metadata and tensor table of a GGUF image in memory (not copied). */
int nl_gguf_parse(struct nl_gguf *g, const char *what, const uint8_t *data, size_t size);
void nl_gguf_release(struct nl_gguf *g);
const struct nl_gguf_kv *nl_gguf_find(const struct nl_gguf *g, const char *key);
const struct nl_gguf_tensor *nl_gguf_find_tensor(const struct nl_gguf *g, const char *name);
/* Integer-valued key of any integer type; NL_E_MISSING when absent, NL_E_TYPE/FORMAT when unusable. */
int nl_gguf_get_u32(const struct nl_gguf *g, const char *key, uint32_t *out);
int nl_gguf_get_f32(const struct nl_gguf *g, const char *key, float *out);
/* String value: pointer into the image and its length. */
int nl_gguf_get_str(const struct nl_gguf *g, const char *key, const uint8_t **s, uint64_t *len);
/* Dequantises a tensor into dst (n_elems floats). */
int nl_gguf_dequant(const struct nl_gguf_tensor *t, float *dst);
const char *nl_ggml_type_name(uint32_t type);

/* Builds a llama model from a parsed GGUF into m (zeroed by the caller). */
int nl_gguf_load_model(struct nl_model *m, const struct nl_gguf *g);

/* ---- vocabulary ---- */

/* Token kinds, as GGUF tokenizer.ggml.token_type numbers them. */
enum nl_tok_type {
	NL_TOK_NORMAL = 1,
	NL_TOK_UNKNOWN = 2,
	NL_TOK_CONTROL = 3,
	NL_TOK_USER = 4,
	NL_TOK_UNUSED = 5,
	NL_TOK_BYTE = 6,
};

int nl_vocab_parse_llama2c(struct nl_vocab **out, const char *what, const uint8_t *data,
			   size_t size, uint32_t vocab_size);
int nl_vocab_from_gguf(struct nl_vocab **out, const struct nl_gguf *g);
/* Merge score of a token (tests compare against a naive encoder). */
float nl_vocab_score(const struct nl_vocab *v, uint32_t id);

#endif
