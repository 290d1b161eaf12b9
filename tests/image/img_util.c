/* Helpers shared by the image tests, the golden generator and the fuzz target. */
#include "img_util.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <xxhash.h>

static uint64_t splitmix(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Multiples of 2^-12 in [-1, 1): exact in F32, distinct enough to catch mix-ups. */
static void fill(float *dst, size_t n, uint64_t *state)
{
	for (size_t i = 0; i < n; i++)
		dst[i] = (float)((int32_t)(splitmix(state) >> 52) - 2048) / 2048.0f;
}

void tu_tiny_config(struct nl_img_config *c)
{
	memset(c, 0, sizeof(*c));
	c->dim = 8;
	c->hidden_dim = 16;
	c->n_layers = 2;
	c->n_heads = 2;
	c->n_kv_heads = 1;
	c->vocab_size = 8;
	c->seq_len = 16;
	c->rms_eps = 1e-5f;
	c->rope_theta = 10000.0f;
	c->shared_classifier = false;
	c->act = NL_IMG_ACT_SILU;
	c->dtype = NL_IMG_F32;
	c->bundle_flags = NL_IMG_BUNDLE_ALL;
	snprintf(c->name, sizeof(c->name), "tiny-golden");
}

void tu_small_config(struct nl_img_config *c)
{
	memset(c, 0, sizeof(*c));
	c->dim = 64;
	c->hidden_dim = 172;
	c->n_layers = 5;
	c->n_heads = 8;
	c->n_kv_heads = 4;
	c->vocab_size = 512;
	c->seq_len = 512;
	c->rms_eps = 1e-5f;
	c->rope_theta = 10000.0f;
	c->shared_classifier = true;
	c->act = NL_IMG_ACT_SILU;
	c->dtype = NL_IMG_F32;
	c->bundle_flags = NL_IMG_BUNDLE_ALL;
	snprintf(c->name, sizeof(c->name), "stories260K-like");
}

int tu_model_make(struct tu_model *m, const struct nl_img_config *c, uint64_t seed)
{
	size_t d = c->dim, h = c->hidden_dim, v = c->vocab_size;
	size_t kv = d / c->n_heads * c->n_kv_heads;
	size_t per_layer = d + d * d + 2 * kv * d + d * d + d + 3 * h * d;
	size_t total = v * d + per_layer * c->n_layers + d + v * d;
	uint64_t state = seed;
	float *p;

	memset(m, 0, sizeof(*m));
	m->storage = malloc(total * sizeof(float));
	m->layers = calloc(c->n_layers, sizeof(*m->layers));
	m->perms = calloc(c->n_layers, sizeof(*m->perms));
	if (!m->storage || !m->layers || !m->perms)
		goto out_free;
	fill(m->storage, total, &state);
	p = m->storage;
	m->weights.token_embedding = p;
	p += v * d;
	for (uint32_t l = 0; l < c->n_layers; l++) {
		struct nl_layer_weights *lw = &m->layers[l];

		lw->attn_norm = p; p += d;
		lw->wq = p; p += d * d;
		lw->wk = p; p += kv * d;
		lw->wv = p; p += kv * d;
		lw->wo = p; p += d * d;
		lw->ffn_norm = p; p += d;
		lw->w_gate = p; p += h * d;
		lw->w_down = p; p += d * h;
		lw->w_up = p; p += h * d;
		m->perms[l] = malloc(h * sizeof(uint32_t));
		if (!m->perms[l])
			goto out_free;
		for (uint32_t i = 0; i < h; i++)
			m->perms[l][i] = i;
		for (uint32_t i = (uint32_t)h - 1; i > 0; i--) {
			uint32_t j = (uint32_t)(splitmix(&state) % (i + 1)), t = m->perms[l][i];

			m->perms[l][i] = m->perms[l][j];
			m->perms[l][j] = t;
		}
	}
	m->weights.layers = m->layers;
	m->weights.final_norm = p;
	p += d;
	m->weights.classifier = c->shared_classifier ? m->weights.token_embedding : p;
	return 0;

out_free:
	tu_model_free(m, c);
	return -ENOMEM;
}

void tu_model_free(struct tu_model *m, const struct nl_img_config *c)
{
	if (m->perms)
		for (uint32_t l = 0; l < c->n_layers; l++)
			free(m->perms[l]);
	free(m->perms);
	free(m->layers);
	free(m->storage);
	memset(m, 0, sizeof(*m));
}

int tu_write_image(const char *path, const struct nl_img_config *c, uint32_t block_size,
		   const struct tu_model *m)
{
	return tu_write_weights(path, c, block_size, &m->weights, (const uint32_t *const *)m->perms);
}

int tu_write_weights(const char *path, const struct nl_img_config *c, uint32_t block_size,
		     const struct nl_model_weights *weights, const uint32_t *const *perms)
{
	struct nl_img_writer *w = NULL;
	struct nl_img_dense_layout lay;
	uint64_t bb = nl_img_bundle_bytes(c);
	uint8_t *dense = NULL, *bundles = NULL;
	int ret;

	ret = nl_img_dense_layout(c, &lay);
	if (ret)
		return ret;
	dense = malloc(lay.size);
	bundles = malloc(bb * c->hidden_dim);
	if (!dense || !bundles) {
		ret = -ENOMEM;
		goto out;
	}
	ret = nl_img_pack_dense(c, weights, dense, lay.size);
	if (ret)
		goto out;
	ret = nl_img_create(&w, path, c, block_size);
	if (ret)
		goto out;
	ret = nl_img_add_dense(w, dense, lay.size);
	for (uint32_t l = 0; l < c->n_layers && !ret; l++) {
		const struct nl_layer_weights *lw = &weights->layers[l];

		for (uint32_t p = 0; p < c->hidden_dim; p++)
			nl_img_pack_bundle(c, lw->w_gate, lw->w_up, lw->w_down, perms[l][p],
					   bundles + p * bb);
		ret = nl_img_add_ffn_layer(w, l, perms[l], bundles, bb * c->hidden_dim);
	}
	if (ret) {
		nl_img_abort(w);
		goto out;
	}
	ret = nl_img_finish(w);
out:
	free(dense);
	free(bundles);
	return ret;
}

uint8_t *tu_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	uint8_t *buf = NULL;
	long size;

	if (!f)
		return NULL;
	if (fseek(f, 0, SEEK_END) || (size = ftell(f)) < 0 || fseek(f, 0, SEEK_SET))
		goto out;
	buf = malloc((size_t)size + 1);
	if (buf && fread(buf, 1, (size_t)size, f) != (size_t)size) {
		free(buf);
		buf = NULL;
	}
	*len = (size_t)size;
out:
	fclose(f);
	return buf;
}

int tu_write_file(const char *path, const void *buf, size_t len)
{
	FILE *f = fopen(path, "wb");
	int ret = 0;

	if (!f)
		return -errno;
	if (len && fwrite(buf, 1, len, f) != len)
		ret = -EIO;
	if (fclose(f) && !ret)
		ret = -EIO;
	return ret;
}

uint32_t tu_ld32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

uint64_t tu_ld64(const uint8_t *p)
{
	return (uint64_t)tu_ld32(p) | (uint64_t)tu_ld32(p + 4) << 32;
}

void tu_st16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

void tu_st32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

void tu_st64(uint8_t *p, uint64_t v)
{
	tu_st32(p, (uint32_t)v);
	tu_st32(p + 4, (uint32_t)(v >> 32));
}

uint8_t *tu_entry(uint8_t *buf, uint32_t i)
{
	return buf + 256 + (size_t)i * 64;
}

/* Number of table entries that fit in buf, capped by the header's count. */
static uint32_t table_entries(const uint8_t *buf, size_t len, int *complete)
{
	uint64_t n = tu_ld32(buf + 32), fit = (len - 256) / 64;

	*complete = n <= fit;
	return (uint32_t)(n < fit ? n : fit);
}

void tu_reseal_header(uint8_t *buf, size_t len)
{
	int complete;
	uint32_t n;

	if (len < 256)
		return;
	n = table_entries(buf, len, &complete);
	if (complete)
		tu_st64(buf + 240, XXH3_64bits_withSeed(buf + 256, (size_t)n * 64, 0));
	tu_st64(buf + 248, XXH3_64bits_withSeed(buf, 248, 0));
}

void tu_reseal(uint8_t *buf, size_t len)
{
	uint64_t bs, cs_off = 0, cs_len = 0, budget = 4 * (uint64_t)len + (1u << 16);
	int complete, have_cs = 0;
	uint32_t n;

	if (len < 256)
		return;
	n = table_entries(buf, len, &complete);
	bs = tu_ld32(buf + 40);
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *e = tu_entry(buf, i);

		if (tu_ld32(e) == NL_IMG_SEC_CHECKSUMS) {
			cs_off = tu_ld64(e + 8);
			cs_len = tu_ld64(e + 16);
			have_cs = cs_off <= len && cs_len <= len - cs_off;
			break;
		}
	}
	if (have_cs && bs >= NL_IMG_BLOCK_MIN && !(bs & (bs - 1))) {
		for (uint32_t i = 0; i < n; i++) {
			const uint8_t *e = tu_entry(buf, i);
			uint64_t off = tu_ld64(e + 8), slen = tu_ld64(e + 16), first = tu_ld64(e + 40);

			if (tu_ld32(e) == NL_IMG_SEC_CHECKSUMS || off > len || slen > len - off)
				continue;
			for (uint64_t k = 0; k * bs < slen; k++) {
				uint64_t start = off + k * bs, nb = slen - k * bs;

				if (nb > bs)
					nb = bs;
				if (first > cs_len / 8 || k >= cs_len / 8 - first || budget < nb)
					break;
				budget -= nb;
				tu_st64(buf + cs_off + 8 * (first + k),
					XXH3_64bits_withSeed(buf + start, (size_t)nb, start));
			}
		}
	}
	if (have_cs)
		tu_st64(buf + 232, XXH3_64bits_withSeed(buf + cs_off, (size_t)cs_len, 0));
	tu_reseal_header(buf, len);
}
