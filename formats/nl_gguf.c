/*
 * GGUF v3 (and v2) reader, architecture "llama"
 * (github.com/ggerganov/ggml docs/gguf.md). Little-endian only.
 *
 *   offset  size  field
 *   0       4     magic "GGUF"
 *   4       4     uint32 version (2 or 3; v1 used 32-bit counts and is refused)
 *   8       8     uint64 tensor_count
 *   16      8     uint64 metadata_kv_count
 *   24      ...   metadata: key (uint64 len + bytes), uint32 value type, value
 *           ...   tensor infos: name, uint32 n_dims, uint64 ne[n_dims] (fastest first),
 *                 uint32 ggml type, uint64 offset (relative to the data section)
 *           ...   padding to general.alignment (default 32), then the data section
 *
 * Everything is bounds-checked against the mapped file before it is used, and
 * counts are checked against what the remaining bytes could possibly hold
 * before anything is allocated.
 */
#include "nl_model_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GGUF_DEFAULT_ALIGNMENT 32u
#define GGUF_MAX_DIMS 4u
#define GGUF_MAX_DEPTH 4      /* nested arrays */
#define GGUF_MAX_COUNT (1u << 24)   /* keys or tensors: beyond this a count is corrupt */
#define GGUF_MAX_ARRAY (1ull << 32) /* array elements */
#define Q8_0_BLOCK 32u        /* ggml block_q8_0: f16 scale + 32 int8 */
#define Q8_0_BYTES 34u

struct cursor {
	const struct nl_gguf *g;
	uint64_t pos;
};

const char *nl_ggml_type_name(uint32_t type)
{
	static const char *const names[] = {
		"F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
		"Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS",
		"IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64",
		"IQ1_M", "BF16",
	};

	if (type < sizeof(names) / sizeof(names[0]))
		return names[type];
	return "unknown";
}

static uint64_t remaining(const struct cursor *c)
{
	return c->g->size - c->pos;
}

static int need(struct cursor *c, uint64_t n, const char *field)
{
	if (n > remaining(c))
		return nl_diag(NL_E_TRUNCATED, "'%s': %s at offset %llu needs %llu bytes, only "
			       "%llu left; the file is truncated", c->g->what, field,
			       (unsigned long long)c->pos, (unsigned long long)n,
			       (unsigned long long)remaining(c));
	return 0;
}

static int rd_u32(struct cursor *c, uint32_t *v, const char *field)
{
	int err = need(c, 4, field);

	if (err)
		return err;
	*v = nl_le32(c->g->base + c->pos);
	c->pos += 4;
	return 0;
}

static int rd_u64(struct cursor *c, uint64_t *v, const char *field)
{
	int err = need(c, 8, field);

	if (err)
		return err;
	*v = nl_le64(c->g->base + c->pos);
	c->pos += 8;
	return 0;
}

static int rd_str(struct cursor *c, const uint8_t **s, uint64_t *len, const char *field)
{
	int err = rd_u64(c, len, field);

	if (err)
		return err;
	err = need(c, *len, field);
	if (err)
		return err;
	*s = c->g->base + c->pos;
	c->pos += *len;
	return 0;
}

static uint64_t scalar_size(uint32_t type)
{
	switch (type) {
	case NL_GGUF_U8: case NL_GGUF_I8: case NL_GGUF_BOOL: return 1;
	case NL_GGUF_U16: case NL_GGUF_I16: return 2;
	case NL_GGUF_U32: case NL_GGUF_I32: case NL_GGUF_F32: return 4;
	case NL_GGUF_U64: case NL_GGUF_I64: case NL_GGUF_F64: return 8;
	}
	return 0;
}

/* Skips one value of `type`; records array details in kv when kv is not NULL. */
static int skip_value(struct cursor *c, uint32_t type, int depth, struct nl_gguf_kv *kv,
		      const char *key)
{
	uint64_t size = scalar_size(type);
	int err;

	if (size) {
		err = need(c, size, key);
		if (!err)
			c->pos += size;
		return err;
	}
	if (type == NL_GGUF_STRING) {
		const uint8_t *s;
		uint64_t len;

		return rd_str(c, &s, &len, key);
	}
	if (type == NL_GGUF_ARRAY) {
		uint32_t elem;
		uint64_t count;

		if (depth >= GGUF_MAX_DEPTH)
			return nl_diag(NL_E_FORMAT, "'%s': key '%s' nests arrays deeper than %d",
				       c->g->what, key, GGUF_MAX_DEPTH);
		err = rd_u32(c, &elem, key);
		if (!err)
			err = rd_u64(c, &count, key);
		if (err)
			return err;
		if (elem > NL_GGUF_F64)
			return nl_diag(NL_E_TYPE, "'%s': key '%s' is an array of value type %u, "
				       "expected 0..12", c->g->what, key, elem);
		/* each element takes at least one byte (strings: 8) */
		size = scalar_size(elem);
		if (count > GGUF_MAX_ARRAY || count > remaining(c) / (size ? size : 8))
			return nl_diag(count > GGUF_MAX_ARRAY ? NL_E_FORMAT : NL_E_TRUNCATED,
				       "'%s': key '%s' claims %llu array elements, more than the "
				       "%llu bytes left can hold", c->g->what, key,
				       (unsigned long long)count, (unsigned long long)remaining(c));
		if (kv) {
			kv->arr_type = elem;
			kv->arr_count = count;
			kv->arr_data = c->g->base + c->pos;
		}
		if (size) {
			c->pos += count * size;
			return 0;
		}
		for (uint64_t i = 0; i < count; i++) {
			err = skip_value(c, elem, depth + 1, NULL, key);
			if (err)
				return err;
		}
		return 0;
	}
	return nl_diag(NL_E_TYPE, "'%s': key '%s' has value type %u, expected 0..12",
		       c->g->what, key, type);
}

static bool name_is(const uint8_t *s, uint64_t len, const char *name)
{
	return strlen(name) == len && memcmp(s, name, len) == 0;
}

static int tensor_bytes(const struct nl_gguf *g, struct nl_gguf_tensor *t)
{
	switch (t->type) {
	case NL_GGML_F32:
		t->n_bytes = t->n_elems * 4;
		break;
	case NL_GGML_F16:
	case NL_GGML_BF16:
		t->n_bytes = t->n_elems * 2;
		break;
	case NL_GGML_Q8_0:
		if (t->ne[0] % Q8_0_BLOCK)
			return nl_diag(NL_E_SHAPE, "'%s': tensor '%s' is Q8_0 with a first "
				       "dimension of %llu, expected a multiple of %u", g->what,
				       t->name, (unsigned long long)t->ne[0], Q8_0_BLOCK);
		t->n_bytes = t->n_elems / Q8_0_BLOCK * Q8_0_BYTES;
		break;
	default:
		return nl_diag(NL_E_TYPE, "'%s': tensor '%s' has type %u (%s); supported: F32, "
			       "F16, BF16, Q8_0", g->what, t->name, t->type,
			       nl_ggml_type_name(t->type));
	}
	return 0;
}

static int parse_tensor(struct cursor *c, struct nl_gguf_tensor *t, uint64_t index)
{
	const struct nl_gguf *g = c->g;
	const uint8_t *name;
	uint64_t name_len;
	int err;

	err = rd_str(c, &name, &name_len, "tensor name");
	if (err)
		return err;
	if (name_len >= sizeof(t->name))
		return nl_diag(NL_E_FORMAT, "'%s': tensor %llu has a %llu-byte name, longer "
			       "than %zu", g->what, (unsigned long long)index,
			       (unsigned long long)name_len, sizeof(t->name) - 1);
	memcpy(t->name, name, name_len);
	t->name[name_len] = '\0';
	if (memchr(t->name, '\0', name_len))
		return nl_diag(NL_E_FORMAT, "'%s': tensor %llu name contains a NUL byte",
			       g->what, (unsigned long long)index);
	err = rd_u32(c, &t->n_dims, t->name);
	if (err)
		return err;
	if (t->n_dims == 0 || t->n_dims > GGUF_MAX_DIMS)
		return nl_diag(NL_E_SHAPE, "'%s': tensor '%s' has %u dimensions, expected 1..%u",
			       g->what, t->name, t->n_dims, GGUF_MAX_DIMS);
	t->n_elems = 1;
	for (uint32_t d = 0; d < GGUF_MAX_DIMS; d++) {
		t->ne[d] = 1;
		if (d >= t->n_dims)
			continue;
		err = rd_u64(c, &t->ne[d], t->name);
		if (err)
			return err;
		/* any real tensor fits in the file, so bound each factor by its size */
		if (t->ne[d] == 0 || t->ne[d] > g->size)
			return nl_diag(NL_E_SHAPE, "'%s': tensor '%s' dimension %u is %llu, "
				       "expected 1..%zu", g->what, t->name, d,
				       (unsigned long long)t->ne[d], g->size);
		if (t->n_elems > g->size / t->ne[d])
			return nl_diag(NL_E_SHAPE, "'%s': tensor '%s' has more elements than the "
				       "file has bytes", g->what, t->name);
		t->n_elems *= t->ne[d];
	}
	err = rd_u32(c, &t->type, t->name);
	if (!err)
		err = rd_u64(c, &t->offset, t->name);
	if (!err)
		err = tensor_bytes(g, t);
	return err;
}

static int cmp_tensor_name(const void *a, const void *b)
{
	return strcmp((*(const struct nl_gguf_tensor *const *)a)->name,
		      (*(const struct nl_gguf_tensor *const *)b)->name);
}

static int check_alignment(struct nl_gguf *g)
{
	const struct nl_gguf_kv *kv = nl_gguf_find(g, "general.alignment");
	uint32_t a;
	int err;

	g->alignment = GGUF_DEFAULT_ALIGNMENT;
	if (!kv)
		return 0;
	err = nl_gguf_get_u32(g, "general.alignment", &a);
	if (err)
		return err;
	if (a == 0 || (a & (a - 1)) || a > (1u << 20))
		return nl_diag(NL_E_FORMAT, "'%s': general.alignment is %u, expected a power "
			       "of two up to 1 MiB", g->what, a);
	g->alignment = a;
	return 0;
}

int nl_gguf_parse(struct nl_gguf *g, const char *what, const uint8_t *data, size_t size)
{
	struct cursor c = { .g = g, .pos = 0 };
	uint32_t magic;
	int err;

	memset(g, 0, sizeof(*g));
	g->what = what;
	g->base = data;
	g->size = size;
	err = rd_u32(&c, &magic, "magic");
	if (err)
		return err;
	if (magic != 0x46554747u)  /* "GGUF" */
		return nl_diag(NL_E_MAGIC, "'%s': magic is 0x%08x, expected 0x46554747 (\"GGUF\")",
			       what, magic);
	err = rd_u32(&c, &g->version, "version");
	if (err)
		return err;
	if (g->version != 2 && g->version != 3)
		return nl_diag(NL_E_VERSION, "'%s': GGUF version is %u, this reader knows 2 and 3",
			       what, g->version);
	err = rd_u64(&c, &g->n_tensors, "tensor_count");
	if (!err)
		err = rd_u64(&c, &g->n_kv, "metadata_kv_count");
	if (err)
		return err;
	/*
	 * A key/value takes >= 13 bytes, a tensor info >= 32: refuse before
	 * allocating. Counts no model has are corrupt; plausible ones that do
	 * not fit mean the file was cut short.
	 */
	if (g->n_kv > GGUF_MAX_COUNT || g->n_kv > remaining(&c) / 13)
		return nl_diag(g->n_kv > GGUF_MAX_COUNT ? NL_E_FORMAT : NL_E_TRUNCATED,
			       "'%s': metadata_kv_count is %llu, more than the file's %zu bytes "
			       "can hold", what, (unsigned long long)g->n_kv, size);
	if (g->n_tensors > GGUF_MAX_COUNT || g->n_tensors > remaining(&c) / 32)
		return nl_diag(g->n_tensors > GGUF_MAX_COUNT ? NL_E_FORMAT : NL_E_TRUNCATED,
			       "'%s': tensor_count is %llu, more than the file's %zu bytes can "
			       "hold", what, (unsigned long long)g->n_tensors, size);
	g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof(*g->kv));
	g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->tensors));
	g->by_name = calloc(g->n_tensors ? g->n_tensors : 1, sizeof(*g->by_name));
	if (!g->kv || !g->tensors || !g->by_name) {
		err = nl_diag(-ENOMEM, "'%s': out of memory", what);
		goto out_release;
	}
	for (uint64_t i = 0; i < g->n_kv; i++) {
		struct nl_gguf_kv *kv = &g->kv[i];
		char key[128];

		err = rd_str(&c, &kv->key, &kv->key_len, "metadata key");
		if (!err)
			err = rd_u32(&c, &kv->type, "metadata value type");
		if (err)
			goto out_release;
		snprintf(key, sizeof(key), "%.*s", (int)(kv->key_len < 100 ? kv->key_len : 100),
			 (const char *)kv->key);
		kv->value = data + c.pos;
		err = skip_value(&c, kv->type, 0, kv, key);
		if (err)
			goto out_release;
	}
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		err = parse_tensor(&c, &g->tensors[i], i);
		if (err)
			goto out_release;
	}
	err = check_alignment(g);
	if (err)
		goto out_release;
	g->data_offset = (c.pos + g->alignment - 1) / g->alignment * g->alignment;
	if (g->data_offset > size && g->n_tensors) {
		err = nl_diag(NL_E_TRUNCATED, "'%s': data section starts at %llu, past the end "
			      "of the %zu-byte file", what, (unsigned long long)g->data_offset, size);
		goto out_release;
	}
	for (uint64_t i = 0; i < g->n_tensors; i++) {
		struct nl_gguf_tensor *t = &g->tensors[i];
		uint64_t avail = size - g->data_offset;

		if (t->offset % g->alignment) {
			err = nl_diag(NL_E_FORMAT, "'%s': tensor '%s' has offset %llu, expected a "
				      "multiple of the alignment %u", what, t->name,
				      (unsigned long long)t->offset, g->alignment);
			goto out_release;
		}
		if (t->offset > avail || t->n_bytes > avail - t->offset) {
			err = nl_diag(NL_E_TRUNCATED, "'%s': tensor '%s' (%llu bytes at data offset "
				      "%llu) ends past the end of the file (data section has %llu "
				      "bytes); the file is truncated", what, t->name,
				      (unsigned long long)t->n_bytes, (unsigned long long)t->offset,
				      (unsigned long long)avail);
			goto out_release;
		}
		t->data = data + g->data_offset + t->offset;
		g->by_name[i] = t;
	}
	/* sorted by name: O(log n) lookups, and duplicates end up side by side */
	qsort(g->by_name, g->n_tensors, sizeof(*g->by_name), cmp_tensor_name);
	for (uint64_t i = 1; i < g->n_tensors; i++)
		if (strcmp(g->by_name[i - 1]->name, g->by_name[i]->name) == 0) {
			err = nl_diag(NL_E_FORMAT, "'%s': tensor '%s' appears twice", what,
				      g->by_name[i]->name);
			goto out_release;
		}
	return 0;
out_release:
	nl_gguf_release(g);
	return err;
}

void nl_gguf_release(struct nl_gguf *g)
{
	free(g->kv);
	free(g->tensors);
	free(g->by_name);
	g->kv = NULL;
	g->tensors = NULL;
	g->by_name = NULL;
}

const struct nl_gguf_kv *nl_gguf_find(const struct nl_gguf *g, const char *key)
{
	for (uint64_t i = 0; i < g->n_kv; i++)
		if (name_is(g->kv[i].key, g->kv[i].key_len, key))
			return &g->kv[i];
	return NULL;
}

const struct nl_gguf_tensor *nl_gguf_find_tensor(const struct nl_gguf *g, const char *name)
{
	uint64_t lo = 0, hi = g->n_tensors;

	while (lo < hi) {
		uint64_t mid = lo + (hi - lo) / 2;
		int c = strcmp(g->by_name[mid]->name, name);

		if (c == 0)
			return g->by_name[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return NULL;
}

int nl_gguf_get_u32(const struct nl_gguf *g, const char *key, uint32_t *out)
{
	const struct nl_gguf_kv *kv = nl_gguf_find(g, key);
	int64_t v;

	if (!kv)
		return nl_diag(NL_E_MISSING, "'%s': metadata key '%s' is missing", g->what, key);
	switch (kv->type) {
	case NL_GGUF_U8: v = kv->value[0]; break;
	case NL_GGUF_I8: v = (int8_t)kv->value[0]; break;
	case NL_GGUF_U16: v = nl_le16(kv->value); break;
	case NL_GGUF_I16: v = (int16_t)nl_le16(kv->value); break;
	case NL_GGUF_U32: v = nl_le32(kv->value); break;
	case NL_GGUF_I32: v = (int32_t)nl_le32(kv->value); break;
	case NL_GGUF_U64:
		if (nl_le64(kv->value) > UINT32_MAX)
			return nl_diag(NL_E_FORMAT, "'%s': metadata key '%s' is %llu, expected "
				       "0..%u", g->what, key,
				       (unsigned long long)nl_le64(kv->value), UINT32_MAX);
		v = (int64_t)nl_le64(kv->value);
		break;
	case NL_GGUF_I64: v = (int64_t)nl_le64(kv->value); break;
	default:
		return nl_diag(NL_E_TYPE, "'%s': metadata key '%s' has value type %u, expected "
			       "an integer", g->what, key, kv->type);
	}
	if (v < 0 || v > UINT32_MAX)
		return nl_diag(NL_E_FORMAT, "'%s': metadata key '%s' is %lld, expected 0..%u",
			       g->what, key, (long long)v, UINT32_MAX);
	*out = (uint32_t)v;
	return 0;
}

int nl_gguf_get_f32(const struct nl_gguf *g, const char *key, float *out)
{
	const struct nl_gguf_kv *kv = nl_gguf_find(g, key);
	uint32_t bits32;
	uint64_t bits64;
	double d;

	if (!kv)
		return nl_diag(NL_E_MISSING, "'%s': metadata key '%s' is missing", g->what, key);
	if (kv->type == NL_GGUF_F32) {
		float f;

		bits32 = nl_le32(kv->value);
		memcpy(&f, &bits32, 4);
		*out = f;
	} else if (kv->type == NL_GGUF_F64) {
		bits64 = nl_le64(kv->value);
		memcpy(&d, &bits64, 8);
		*out = (float)d;
	} else {
		return nl_diag(NL_E_TYPE, "'%s': metadata key '%s' has value type %u, expected "
			       "a float", g->what, key, kv->type);
	}
	if (!isfinite(*out))
		return nl_diag(NL_E_FORMAT, "'%s': metadata key '%s' is not finite", g->what, key);
	return 0;
}

int nl_gguf_get_str(const struct nl_gguf *g, const char *key, const uint8_t **s, uint64_t *len)
{
	const struct nl_gguf_kv *kv = nl_gguf_find(g, key);

	if (!kv)
		return nl_diag(NL_E_MISSING, "'%s': metadata key '%s' is missing", g->what, key);
	if (kv->type != NL_GGUF_STRING)
		return nl_diag(NL_E_TYPE, "'%s': metadata key '%s' has value type %u, expected "
			       "a string", g->what, key, kv->type);
	*len = nl_le64(kv->value);
	*s = kv->value + 8;
	return 0;
}

int nl_gguf_dequant(const struct nl_gguf_tensor *t, float *dst)
{
	const uint8_t *src = t->data;

	switch (t->type) {
	case NL_GGML_F32:
		nl_load_f32_le(dst, src, t->n_elems);
		break;
	case NL_GGML_F16:
		for (uint64_t i = 0; i < t->n_elems; i++)
			dst[i] = nl_f16_to_f32(nl_le16(src + 2 * i));
		break;
	case NL_GGML_BF16:
		for (uint64_t i = 0; i < t->n_elems; i++)
			dst[i] = nl_bf16_to_f32(nl_le16(src + 2 * i));
		break;
	case NL_GGML_Q8_0:
		for (uint64_t b = 0; b < t->n_elems / Q8_0_BLOCK; b++) {
			const uint8_t *blk = src + b * Q8_0_BYTES;
			float d = nl_f16_to_f32(nl_le16(blk));

			for (uint32_t i = 0; i < Q8_0_BLOCK; i++)
				dst[b * Q8_0_BLOCK + i] = d * (float)(int8_t)blk[2 + i];
		}
		break;
	default:
		return nl_diag(NL_E_TYPE, "tensor '%s' has type %u (%s); supported: F32, F16, "
			       "BF16, Q8_0", t->name, t->type, nl_ggml_type_name(t->type));
	}
	return 0;
}

/* ---- llama model ---- */

struct want {
	const char *name;     /* printf pattern with %u for the layer */
	uint64_t ne0, ne1;    /* ne1 == 0: a vector */
	bool optional;
};

static int get_tensor(const struct nl_gguf *g, const char *name, uint64_t ne0, uint64_t ne1,
		      const struct nl_gguf_tensor **out)
{
	const struct nl_gguf_tensor *t = nl_gguf_find_tensor(g, name);
	uint32_t dims = ne1 ? 2 : 1;

	*out = t;
	if (!t)
		return nl_diag(NL_E_MISSING, "'%s': tensor '%s' is missing", g->what, name);
	/* trailing dimensions of 1 are allowed: ggml writes [n] as n_dims 1 */
	for (uint32_t d = dims; d < t->n_dims; d++)
		if (t->ne[d] != 1)
			goto shape;
	if (t->ne[0] != ne0 || (ne1 && t->ne[1] != ne1) || (!ne1 && t->ne[1] != 1))
		goto shape;
	return 0;
shape:
	if (ne1)
		return nl_diag(NL_E_SHAPE, "'%s': tensor '%s' has shape [%llu, %llu, %llu, %llu] "
			       "(fastest first), expected [%llu, %llu] from the metadata",
			       g->what, name, (unsigned long long)t->ne[0],
			       (unsigned long long)t->ne[1], (unsigned long long)t->ne[2],
			       (unsigned long long)t->ne[3], (unsigned long long)ne0,
			       (unsigned long long)ne1);
	return nl_diag(NL_E_SHAPE, "'%s': tensor '%s' has shape [%llu, %llu, %llu, %llu], "
		       "expected [%llu] from the metadata", g->what, name,
		       (unsigned long long)t->ne[0], (unsigned long long)t->ne[1],
		       (unsigned long long)t->ne[2], (unsigned long long)t->ne[3],
		       (unsigned long long)ne0);
}

static int load_config(struct nl_model_config *c, const struct nl_gguf *g)
{
	const struct nl_gguf_tensor *emb;
	const uint8_t *s;
	uint64_t len;
	uint32_t rope_dims;
	int err;

	err = nl_gguf_get_str(g, "general.architecture", &s, &len);
	if (err)
		return err;
	if (!name_is(s, len, "llama"))
		return nl_diag(NL_E_UNSUPPORTED, "'%s': general.architecture is '%.*s', this "
			       "reader supports 'llama'", g->what, (int)(len < 64 ? len : 64),
			       (const char *)s);
	if ((err = nl_gguf_get_u32(g, "llama.embedding_length", &c->dim)) ||
	    (err = nl_gguf_get_u32(g, "llama.feed_forward_length", &c->hidden_dim)) ||
	    (err = nl_gguf_get_u32(g, "llama.block_count", &c->n_layers)) ||
	    (err = nl_gguf_get_u32(g, "llama.attention.head_count", &c->n_heads)) ||
	    (err = nl_gguf_get_u32(g, "llama.context_length", &c->seq_len)))
		return err;
	c->n_kv_heads = c->n_heads;
	if (nl_gguf_find(g, "llama.attention.head_count_kv") &&
	    (err = nl_gguf_get_u32(g, "llama.attention.head_count_kv", &c->n_kv_heads)))
		return err;
	c->rms_eps = 1e-5f;
	if (nl_gguf_find(g, "llama.attention.layer_norm_rms_epsilon") &&
	    (err = nl_gguf_get_f32(g, "llama.attention.layer_norm_rms_epsilon", &c->rms_eps)))
		return err;
	c->rope_theta = 10000.0f;
	if (nl_gguf_find(g, "llama.rope.freq_base") &&
	    (err = nl_gguf_get_f32(g, "llama.rope.freq_base", &c->rope_theta)))
		return err;
	emb = nl_gguf_find_tensor(g, "token_embd.weight");
	if (!emb)
		return nl_diag(NL_E_MISSING, "'%s': tensor 'token_embd.weight' is missing",
			       g->what);
	c->vocab_size = emb->n_dims >= 2 && emb->ne[1] <= UINT32_MAX ? (uint32_t)emb->ne[1] : 0;
	c->shared_classifier = nl_gguf_find_tensor(g, "output.weight") == NULL;
	c->source = NL_MODEL_GGUF;
	if (nl_gguf_find(g, "general.name")) {
		err = nl_gguf_get_str(g, "general.name", &s, &len);
		if (err)
			return err;
		/* converters often put the source file name here: drop its extension */
		if (len >= 4 && memcmp(s + len - 4, ".bin", 4) == 0)
			len -= 4;
		else if (len >= 5 && memcmp(s + len - 5, ".gguf", 5) == 0)
			len -= 5;
		if (len >= sizeof(c->name))
			len = sizeof(c->name) - 1;
		for (uint64_t i = 0; i < len; i++)
			c->name[i] = s[i] >= 0x20 && s[i] != 0x7f ? (char)s[i] : '_';
		c->name[len] = '\0';
	} else {
		nl_model_stem(c->name, sizeof(c->name), g->what);
	}
	err = nl_model_check_config(c, g->what);
	if (err)
		return err;
	if (nl_gguf_find(g, "llama.rope.dimension_count")) {
		err = nl_gguf_get_u32(g, "llama.rope.dimension_count", &rope_dims);
		if (err)
			return err;
		if (rope_dims != c->dim / c->n_heads)
			return nl_diag(NL_E_UNSUPPORTED, "'%s': llama.rope.dimension_count is %u, "
				       "only full-head RoPE (%u) is supported", g->what, rope_dims,
				       c->dim / c->n_heads);
	}
	return 0;
}

/* Dequantises tensor `name` (shape already checked) at *cursor and advances it. */
static int load_tensor(const struct nl_gguf *g, const char *name, float **cursor,
		       const float **dst)
{
	const struct nl_gguf_tensor *t = nl_gguf_find_tensor(g, name);
	int err = nl_gguf_dequant(t, *cursor);

	if (err)
		return nl_diag_prefix(err, "'%s': ", g->what);
	*dst = *cursor;
	*cursor += t->n_elems;
	return 0;
}

int nl_gguf_load_model(struct nl_model *m, const struct nl_gguf *g)
{
	struct nl_model_config *c = &m->config;
	const struct nl_gguf_tensor *t;
	uint64_t D, H, KV, V, total, per_layer;
	char name[96];
	float *cursor;
	int err;

	err = load_config(c, g);
	if (err)
		return err;
	D = c->dim;
	H = c->hidden_dim;
	KV = D / c->n_heads * c->n_kv_heads;
	V = c->vocab_size;
	per_layer = 2 * D + 2 * D * D + 2 * KV * D + 3 * H * D;
	total = V * D + c->n_layers * per_layer + D + (c->shared_classifier ? 0 : V * D);
	/* Shapes first, so a bad file is refused before the big allocation. */
	if ((err = get_tensor(g, "token_embd.weight", D, V, &t)) ||
	    (err = get_tensor(g, "output_norm.weight", D, 0, &t)))
		return err;
	if (!c->shared_classifier && (err = get_tensor(g, "output.weight", D, V, &t)))
		return err;
	for (uint32_t l = 0; l < c->n_layers; l++) {
		const struct want want[] = {
			{ "attn_norm", D, 0, false }, { "attn_q", D, D, false },
			{ "attn_k", D, KV, false }, { "attn_v", D, KV, false },
			{ "attn_output", D, D, false }, { "ffn_norm", D, 0, false },
			{ "ffn_gate", D, H, false }, { "ffn_up", D, H, false },
			{ "ffn_down", H, D, false },
		};

		for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++) {
			snprintf(name, sizeof(name), "blk.%u.%s.weight", l, want[i].name);
			err = get_tensor(g, name, want[i].ne0, want[i].ne1, &t);
			if (err)
				return err;
		}
	}
	err = nl_model_alloc(m, total);
	if (err)
		return err;
	cursor = m->arena;
	err = load_tensor(g, "token_embd.weight", &cursor, &m->weights.token_embedding);
	for (uint32_t l = 0; l < c->n_layers && !err; l++) {
		struct nl_layer_weights *lw = &m->layers[l];
		const struct { const float **dst; const char *name; } map[] = {
			{ &lw->attn_norm, "attn_norm" }, { &lw->wq, "attn_q" },
			{ &lw->wk, "attn_k" }, { &lw->wv, "attn_v" },
			{ &lw->wo, "attn_output" }, { &lw->ffn_norm, "ffn_norm" },
			{ &lw->w_gate, "ffn_gate" }, { &lw->w_up, "ffn_up" },
			{ &lw->w_down, "ffn_down" },
		};

		for (size_t i = 0; i < sizeof(map) / sizeof(map[0]) && !err; i++) {
			snprintf(name, sizeof(name), "blk.%u.%s.weight", l, map[i].name);
			err = load_tensor(g, name, &cursor, map[i].dst);
		}
	}
	if (!err)
		err = load_tensor(g, "output_norm.weight", &cursor, &m->weights.final_norm);
	if (err)
		return err;
	if (c->shared_classifier)
		m->weights.classifier = m->weights.token_embedding;
	else
		err = load_tensor(g, "output.weight", &cursor, &m->weights.classifier);
	return err;
}
