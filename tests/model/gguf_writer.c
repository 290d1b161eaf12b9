#include "gguf_writer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nl_model_internal.h"

struct buf {
	uint8_t *p;
	size_t n, cap;
};

struct gw_tensor {
	char name[96];
	uint32_t n_dims, type;
	uint64_t ne[4];
	uint8_t *data;
	size_t bytes;
};

struct gw {
	struct buf kv;
	uint64_t n_kv;
	struct gw_tensor *t;
	size_t n_t, cap_t;
};

static void put(struct buf *b, const void *src, size_t n)
{
	if (b->n + n > b->cap) {
		b->cap = (b->n + n) * 2 + 64;
		b->p = realloc(b->p, b->cap);
		if (!b->p)
			abort();
	}
	memcpy(b->p + b->n, src, n);
	b->n += n;
}

static void put_u32(struct buf *b, uint32_t v)
{
	uint8_t le[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };

	put(b, le, 4);
}

static void put_u64(struct buf *b, uint64_t v)
{
	put_u32(b, (uint32_t)v);
	put_u32(b, (uint32_t)(v >> 32));
}

static void put_f32(struct buf *b, float f)
{
	uint32_t bits;

	memcpy(&bits, &f, 4);
	put_u32(b, bits);
}

static void put_str(struct buf *b, const char *s)
{
	put_u64(b, strlen(s));
	put(b, s, strlen(s));
}

struct gw *gw_new(void)
{
	return calloc(1, sizeof(struct gw));
}

void gw_free(struct gw *g)
{
	if (!g)
		return;
	for (size_t i = 0; i < g->n_t; i++)
		free(g->t[i].data);
	free(g->t);
	free(g->kv.p);
	free(g);
}

static void key(struct gw *g, const char *k, uint32_t type)
{
	put_str(&g->kv, k);
	put_u32(&g->kv, type);
	g->n_kv++;
}

void gw_kv_str(struct gw *g, const char *k, const char *value)
{
	key(g, k, NL_GGUF_STRING);
	put_str(&g->kv, value);
}

void gw_kv_u32(struct gw *g, const char *k, uint32_t value)
{
	key(g, k, NL_GGUF_U32);
	put_u32(&g->kv, value);
}

void gw_kv_f32(struct gw *g, const char *k, float value)
{
	key(g, k, NL_GGUF_F32);
	put_f32(&g->kv, value);
}

void gw_kv_arr_str(struct gw *g, const char *k, const char *const *values, uint32_t n)
{
	key(g, k, NL_GGUF_ARRAY);
	put_u32(&g->kv, NL_GGUF_STRING);
	put_u64(&g->kv, n);
	for (uint32_t i = 0; i < n; i++)
		put_str(&g->kv, values[i]);
}

void gw_kv_arr_f32(struct gw *g, const char *k, const float *values, uint32_t n)
{
	key(g, k, NL_GGUF_ARRAY);
	put_u32(&g->kv, NL_GGUF_F32);
	put_u64(&g->kv, n);
	for (uint32_t i = 0; i < n; i++)
		put_f32(&g->kv, values[i]);
}

void gw_kv_arr_i32(struct gw *g, const char *k, const int32_t *values, uint32_t n)
{
	key(g, k, NL_GGUF_ARRAY);
	put_u32(&g->kv, NL_GGUF_I32);
	put_u64(&g->kv, n);
	for (uint32_t i = 0; i < n; i++)
		put_u32(&g->kv, (uint32_t)values[i]);
}

void gw_tensor_raw(struct gw *g, const char *name, uint32_t n_dims, const uint64_t *ne,
		   uint32_t type, const void *data, size_t bytes)
{
	struct gw_tensor *t;

	if (g->n_t == g->cap_t) {
		g->cap_t = g->cap_t * 2 + 16;
		g->t = realloc(g->t, g->cap_t * sizeof(*g->t));
		if (!g->t)
			abort();
	}
	t = &g->t[g->n_t++];
	memset(t, 0, sizeof(*t));
	snprintf(t->name, sizeof(t->name), "%s", name);
	t->n_dims = n_dims;
	t->type = type;
	for (uint32_t d = 0; d < n_dims && d < 4; d++)
		t->ne[d] = ne[d];
	t->data = malloc(bytes ? bytes : 1);
	if (!t->data)
		abort();
	memcpy(t->data, data, bytes);
	t->bytes = bytes;
}

static struct gw_tensor *find(struct gw *g, const char *name)
{
	for (size_t i = 0; i < g->n_t; i++)
		if (strcmp(g->t[i].name, name) == 0)
			return &g->t[i];
	abort();
}

void gw_replace_tensor(struct gw *g, const char *name, uint32_t n_dims, const uint64_t *ne,
		       uint32_t type, const void *data, size_t bytes)
{
	struct gw_tensor *t = find(g, name), *last;

	gw_tensor_raw(g, name, n_dims, ne, type, data, bytes);
	t = find(g, name);  /* the array may have moved */
	last = &g->t[g->n_t - 1];
	free(t->data);
	*t = *last;
	g->n_t--;
}

void gw_remove_tensor(struct gw *g, const char *name)
{
	struct gw_tensor *t = find(g, name);
	size_t i = (size_t)(t - g->t);

	free(t->data);
	memmove(t, t + 1, (g->n_t - i - 1) * sizeof(*t));
	g->n_t--;
}

uint16_t gw_f32_to_bf16(float f)
{
	uint32_t u;

	memcpy(&u, &f, 4);
	if ((u & 0x7fffffff) > 0x7f800000)
		return (uint16_t)((u >> 16) | 64);  /* quiet nan */
	return (uint16_t)((u + (0x7fff + ((u >> 16) & 1))) >> 16);
}

void gw_quantize_q8_0(const float *x, size_t n, uint8_t *out)
{
	for (size_t b = 0; b < n / 32; b++) {
		const float *blk = x + b * 32;
		uint8_t *o = out + b * 34;
		float amax = 0.0f, d, id;
		uint16_t dh;

		for (int i = 0; i < 32; i++)
			if (fabsf(blk[i]) > amax)
				amax = fabsf(blk[i]);
		d = amax / 127.0f;
		id = d ? 1.0f / d : 0.0f;
		dh = nl_f32_to_f16(d);
		o[0] = (uint8_t)dh;
		o[1] = (uint8_t)(dh >> 8);
		for (int i = 0; i < 32; i++)
			o[2 + i] = (uint8_t)(int8_t)roundf(blk[i] * id);
	}
}

void gw_tensor(struct gw *g, const char *name, uint32_t n_dims, const uint64_t *ne,
	       uint32_t type, const float *data)
{
	size_t n = 1, bytes;
	uint8_t *raw;

	for (uint32_t d = 0; d < n_dims; d++)
		n *= ne[d];
	bytes = type == NL_GGML_F32 ? 4 * n : type == NL_GGML_Q8_0 ? n / 32 * 34 : 2 * n;
	raw = malloc(bytes);
	if (!raw)
		abort();
	for (size_t i = 0; type != NL_GGML_Q8_0 && i < n; i++) {
		uint32_t bits;
		uint16_t h;

		switch (type) {
		case NL_GGML_F32:
			memcpy(&bits, &data[i], 4);
			memcpy(raw + 4 * i, &bits, 4);
			break;
		case NL_GGML_F16:
			h = nl_f32_to_f16(data[i]);
			memcpy(raw + 2 * i, &h, 2);
			break;
		default:
			h = gw_f32_to_bf16(data[i]);
			memcpy(raw + 2 * i, &h, 2);
			break;
		}
	}
	if (type == NL_GGML_Q8_0)
		gw_quantize_q8_0(data, n, raw);
	gw_tensor_raw(g, name, n_dims, ne, type, raw, bytes);
	free(raw);
}

uint8_t *gw_bytes(struct gw *g, uint32_t version, uint32_t alignment, size_t *size)
{
	struct buf b = { 0 };
	uint64_t offset = 0;
	static const uint8_t zeros[64];

	put(&b, "GGUF", 4);
	put_u32(&b, version);
	put_u64(&b, g->n_t);
	put_u64(&b, g->n_kv);
	put(&b, g->kv.p, g->kv.n);
	for (size_t i = 0; i < g->n_t; i++) {
		put_str(&b, g->t[i].name);
		put_u32(&b, g->t[i].n_dims);
		for (uint32_t d = 0; d < g->t[i].n_dims; d++)
			put_u64(&b, g->t[i].ne[d]);
		put_u32(&b, g->t[i].type);
		put_u64(&b, offset);
		offset += (g->t[i].bytes + alignment - 1) / alignment * alignment;
	}
	for (size_t i = 0; i <= g->n_t; i++) {
		while (b.n % alignment)
			put(&b, zeros, 1);
		if (i < g->n_t)
			put(&b, g->t[i].data, g->t[i].bytes);
	}
	*size = b.n;
	return b.p;
}

int gw_write(struct gw *g, const char *path)
{
	size_t size;
	uint8_t *bytes = gw_bytes(g, 3, 32, &size);
	FILE *f = fopen(path, "wb");
	int err = 0;

	if (!f || fwrite(bytes, 1, size, f) != size)
		err = -1;
	if (f && fclose(f))
		err = -1;
	free(bytes);
	return err;
}

struct gw *gw_from_model(const struct nl_model *m, uint32_t matrix_type)
{
	const struct nl_model_config *c = nl_model_get_config(m);
	const struct nl_model_weights *w = nl_model_get_weights(m);
	uint64_t D = c->dim, H = c->hidden_dim, V = c->vocab_size;
	uint64_t KV = D / c->n_heads * c->n_kv_heads;
	struct gw *g = gw_new();
	char name[96];

	gw_kv_str(g, "general.architecture", "llama");
	gw_kv_str(g, "general.name", c->name);
	gw_kv_u32(g, "llama.context_length", c->seq_len);
	gw_kv_u32(g, "llama.embedding_length", c->dim);
	gw_kv_u32(g, "llama.block_count", c->n_layers);
	gw_kv_u32(g, "llama.feed_forward_length", c->hidden_dim);
	gw_kv_u32(g, "llama.attention.head_count", c->n_heads);
	gw_kv_u32(g, "llama.attention.head_count_kv", c->n_kv_heads);
	gw_kv_f32(g, "llama.rope.freq_base", c->rope_theta);
	gw_kv_f32(g, "llama.attention.layer_norm_rms_epsilon", c->rms_eps);
#define MAT(nm, ne0, ne1, ptr) do {                                                   \
		uint64_t ne_[2] = { (ne0), (ne1) };                                    \
		uint32_t ty_ = matrix_type == NL_GGML_Q8_0 && (ne0) % 32 ? NL_GGML_F32 \
			: matrix_type;                                                 \
		gw_tensor(g, (nm), 2, ne_, ty_, (ptr));                                \
	} while (0)
#define VEC(nm, ne0, ptr) do {                                    \
		uint64_t ne_[1] = { (ne0) };                       \
		gw_tensor(g, (nm), 1, ne_, NL_GGML_F32, (ptr));    \
	} while (0)
	MAT("token_embd.weight", D, V, w->token_embedding);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		const struct nl_layer_weights *lw = &w->layers[l];

		snprintf(name, sizeof(name), "blk.%u.attn_norm.weight", l);
		VEC(name, D, lw->attn_norm);
		snprintf(name, sizeof(name), "blk.%u.attn_q.weight", l);
		MAT(name, D, D, lw->wq);
		snprintf(name, sizeof(name), "blk.%u.attn_k.weight", l);
		MAT(name, D, KV, lw->wk);
		snprintf(name, sizeof(name), "blk.%u.attn_v.weight", l);
		MAT(name, D, KV, lw->wv);
		snprintf(name, sizeof(name), "blk.%u.attn_output.weight", l);
		MAT(name, D, D, lw->wo);
		snprintf(name, sizeof(name), "blk.%u.ffn_norm.weight", l);
		VEC(name, D, lw->ffn_norm);
		snprintf(name, sizeof(name), "blk.%u.ffn_gate.weight", l);
		MAT(name, D, H, lw->w_gate);
		snprintf(name, sizeof(name), "blk.%u.ffn_down.weight", l);
		MAT(name, H, D, lw->w_down);
		snprintf(name, sizeof(name), "blk.%u.ffn_up.weight", l);
		MAT(name, D, H, lw->w_up);
	}
	VEC("output_norm.weight", D, w->final_norm);
	if (!c->shared_classifier)
		MAT("output.weight", D, V, w->classifier);
#undef MAT
#undef VEC
	return g;
}
