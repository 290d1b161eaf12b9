/*
 * Model checkpoints: format detection, ownership and the helpers the llama2.c
 * and GGUF readers share (file mapping, half-precision conversion, config checks).
 */
#include "nl_model_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

float nl_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h >> 15) << 31;
	uint32_t exp = (h >> 10) & 0x1f;
	uint32_t mant = h & 0x3ff;
	uint32_t bits;
	float f;

	if (exp == 0x1f) {
		bits = sign | 0x7f800000u | mant << 13;  /* inf / nan */
	} else if (exp != 0) {
		bits = sign | (exp + 112) << 23 | mant << 13;
	} else if (mant == 0) {
		bits = sign;
	} else {
		/* subnormal half: normalise into a float */
		exp = 113;
		while (!(mant & 0x400)) {
			mant <<= 1;
			exp--;
		}
		bits = sign | exp << 23 | (mant & 0x3ff) << 13;
	}
	memcpy(&f, &bits, sizeof(f));
	return f;
}

uint16_t nl_f32_to_f16(float f)
{
	uint32_t bits, sign, mant;
	int32_t exp;

	memcpy(&bits, &f, sizeof(bits));
	sign = (bits >> 16) & 0x8000;
	exp = (int32_t)((bits >> 23) & 0xff) - 127 + 15;
	mant = bits & 0x7fffff;
	if (((bits >> 23) & 0xff) == 0xff)
		return (uint16_t)(sign | 0x7c00 | (mant ? 0x200 : 0));
	if (exp >= 31)
		return (uint16_t)(sign | 0x7c00);
	if (exp <= 0) {
		uint32_t shift, half, rounded;

		if (exp < -10)
			return (uint16_t)sign;
		mant |= 0x800000;
		shift = (uint32_t)(14 - exp);
		half = 1u << (shift - 1);
		rounded = mant >> shift;
		if ((mant & ((1u << shift) - 1)) > half ||
		    ((mant & ((1u << shift) - 1)) == half && (rounded & 1)))
			rounded++;
		return (uint16_t)(sign | rounded);
	}
	{
		uint32_t h = sign | (uint32_t)exp << 10 | mant >> 13;
		uint32_t rest = mant & 0x1fff;

		/* carries into the exponent (and to inf) are what IEEE wants */
		if (rest > 0x1000 || (rest == 0x1000 && (h & 1)))
			h++;
		return (uint16_t)h;
	}
}

float nl_bf16_to_f32(uint16_t h)
{
	uint32_t bits = (uint32_t)h << 16;
	float f;

	memcpy(&f, &bits, sizeof(f));
	return f;
}

void nl_load_f32_le(float *dst, const uint8_t *src, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
	memcpy(dst, src, n * sizeof(float));
#else
	for (size_t i = 0; i < n; i++) {
		uint32_t bits = nl_le32(src + 4 * i);

		memcpy(&dst[i], &bits, sizeof(float));
	}
#endif
}

int nl_map_file(const char *path, const uint8_t **map, size_t *size)
{
	struct stat st;
	void *p;
	int fd, err = 0;

	*map = NULL;
	*size = 0;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return nl_diag(-errno, "'%s': cannot open: %s", path, strerror(errno));
	if (fstat(fd, &st) < 0) {
		err = nl_diag(-errno, "'%s': cannot stat: %s", path, strerror(errno));
		goto out_close;
	}
	if (!S_ISREG(st.st_mode)) {
		err = nl_diag(NL_E_INVAL, "'%s': not a regular file", path);
		goto out_close;
	}
	if (st.st_size == 0)
		goto out_close;
	p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (p == MAP_FAILED) {
		err = nl_diag(-errno, "'%s': cannot map: %s", path, strerror(errno));
		goto out_close;
	}
	*map = p;
	*size = (size_t)st.st_size;
out_close:
	close(fd);
	return err;
}

void nl_unmap_file(const uint8_t *map, size_t size)
{
	if (map && size)
		munmap((void *)map, size);
}

void nl_model_stem(char *dst, size_t size, const char *path)
{
	const char *base = strrchr(path, '/');
	const char *dot;
	size_t len;

	base = base ? base + 1 : path;
	dot = strrchr(base, '.');
	len = dot && dot != base ? (size_t)(dot - base) : strlen(base);
	if (len >= size)
		len = size - 1;
	memcpy(dst, base, len);
	dst[len] = '\0';
}

int nl_model_check_config(const struct nl_model_config *c, const char *what)
{
	if (c->dim == 0 || c->dim > NL_MODEL_MAX_DIM)
		return nl_diag(NL_E_FORMAT, "'%s': dim is %u, expected 1..%u", what, c->dim,
			       NL_MODEL_MAX_DIM);
	if (c->hidden_dim == 0 || c->hidden_dim > NL_MODEL_MAX_DIM)
		return nl_diag(NL_E_FORMAT, "'%s': hidden_dim is %u, expected 1..%u", what,
			       c->hidden_dim, NL_MODEL_MAX_DIM);
	if (c->n_layers == 0 || c->n_layers > NL_MAX_LAYERS)
		return nl_diag(NL_E_FORMAT, "'%s': n_layers is %u, expected 1..%u", what,
			       c->n_layers, NL_MAX_LAYERS);
	if (c->n_heads == 0 || c->n_heads > NL_MODEL_MAX_HEADS || c->dim % c->n_heads)
		return nl_diag(NL_E_FORMAT, "'%s': n_heads is %u, expected a divisor of dim %u",
			       what, c->n_heads, c->dim);
	if ((c->dim / c->n_heads) % 2)
		return nl_diag(NL_E_FORMAT, "'%s': head size %u (dim %u / n_heads %u) is odd; "
			       "RoPE needs pairs", what, c->dim / c->n_heads, c->dim, c->n_heads);
	if (c->n_kv_heads == 0 || c->n_kv_heads > c->n_heads || c->n_heads % c->n_kv_heads)
		return nl_diag(NL_E_FORMAT, "'%s': n_kv_heads is %u, expected a divisor of "
			       "n_heads %u", what, c->n_kv_heads, c->n_heads);
	if (c->vocab_size == 0 || c->vocab_size > NL_MODEL_MAX_VOCAB)
		return nl_diag(NL_E_FORMAT, "'%s': vocab_size is %u, expected 1..%u", what,
			       c->vocab_size, NL_MODEL_MAX_VOCAB);
	if (c->seq_len == 0 || c->seq_len > NL_MODEL_MAX_SEQ)
		return nl_diag(NL_E_FORMAT, "'%s': seq_len is %u, expected 1..%u", what,
			       c->seq_len, NL_MODEL_MAX_SEQ);
	if (!(c->rms_eps > 0.0f && c->rms_eps < 1.0f))
		return nl_diag(NL_E_FORMAT, "'%s': rms_eps is %g, expected in (0, 1)", what,
			       (double)c->rms_eps);
	if (!(c->rope_theta > 1.0f && c->rope_theta < 1e30f))
		return nl_diag(NL_E_FORMAT, "'%s': rope_theta is %g, expected > 1", what,
			       (double)c->rope_theta);
	return 0;
}

int nl_model_alloc(struct nl_model *m, size_t floats)
{
	m->arena = malloc(floats * sizeof(float));
	m->layers = calloc(m->config.n_layers, sizeof(*m->layers));
	if (!m->arena || !m->layers)
		return nl_diag(-ENOMEM, "cannot allocate %zu MiB for the model weights",
			       floats * sizeof(float) >> 20);
	m->arena_floats = floats;
	m->weights.layers = m->layers;
	return 0;
}

int nl_model_open(struct nl_model **out, const char *path)
{
	struct nl_model *m;
	const uint8_t *map;
	size_t size;
	int err;

	*out = NULL;
	err = nl_map_file(path, &map, &size);
	if (err)
		return err;
	m = calloc(1, sizeof(*m));
	if (!m) {
		err = nl_diag(-ENOMEM, "'%s': out of memory", path);
		goto out_unmap;
	}
	if (size >= 4 && memcmp(map, "GGUF", 4) == 0) {
		struct nl_gguf g;

		err = nl_gguf_parse(&g, path, map, size);
		if (err)
			goto out_free;
		err = nl_gguf_load_model(m, &g);
		nl_gguf_release(&g);
	} else {
		err = nl_llama2c_parse(m, path, map, size);
	}
	if (err)
		goto out_free;
	*out = m;
	goto out_unmap;
out_free:
	nl_model_free(m);
out_unmap:
	nl_unmap_file(map, size);
	return err;
}

const struct nl_model_config *nl_model_get_config(const struct nl_model *m)
{
	return &m->config;
}

const struct nl_model_weights *nl_model_get_weights(const struct nl_model *m)
{
	return &m->weights;
}

void nl_model_get_id(const struct nl_model *m, struct nl_model_id *id)
{
	memset(id, 0, sizeof(*id));
	snprintf(id->name, sizeof(id->name), "%s", m->config.name);
	id->n_layers = m->config.n_layers;
	id->d_model = m->config.dim;
	id->n_neurons = m->config.hidden_dim;
}

void nl_model_free(struct nl_model *m)
{
	if (!m)
		return;
	free(m->arena);
	free(m->layers);
	free(m);
}
