/*
 * The flash image ".nlimg": writer, header/section-table parser and reader.
 * docs/formats/nlimg.md is the specification; field offsets below cite it.
 * Everything on disk is little-endian and decoded field by field.
 */
#include "nl_image.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <xxhash.h>

/* Header field offsets (docs/formats/nlimg.md, "Header"). */
#define H_MAGIC 0
#define H_MAJOR 8
#define H_MINOR 10
#define H_HEADER_SIZE 12
#define H_FILE_SIZE 16
#define H_TABLE_OFFSET 24
#define H_SECTION_COUNT 32
#define H_ENTRY_SIZE 36
#define H_BLOCK_SIZE 40
#define H_BUNDLE_FLAGS 44
#define H_DIM 48
#define H_HIDDEN_DIM 52
#define H_N_LAYERS 56
#define H_N_HEADS 60
#define H_N_KV_HEADS 64
#define H_VOCAB_SIZE 68
#define H_SEQ_LEN 72
#define H_RMS_EPS 76
#define H_ROPE_THETA 80
#define H_SHARED 84
#define H_ACT 85
#define H_DTYPE 86
#define H_RESERVED0 87
#define H_NAME 88
#define H_NAME_SIZE 128
#define H_RESERVED1 216
#define H_RESERVED1_SIZE 16
#define H_CHECKSUMS_HASH 232
#define H_TABLE_HASH 240
#define H_HEADER_HASH 248

/* Section table entry field offsets ("Section table"). */
#define E_KIND 0
#define E_LAYER 4
#define E_OFFSET 8
#define E_LENGTH 16
#define E_FLAGS 24
#define E_STRIDE 28
#define E_COUNT 32
#define E_CSUM_FIRST 40
#define E_RESERVED 48
#define E_RESERVED_SIZE 16

/* Limits that keep every size computation far from overflow. */
#define MAX_DIM (1u << 16)
#define MAX_HIDDEN (1u << 20)
#define MAX_VOCAB (1u << 24)
#define MAX_SEQ_LEN (1u << 24)

#define FIX_PACK "re-run nl-pack to rebuild the image"

static uint16_t ld16(const uint8_t *p)
{
	return (uint16_t)(p[0] | p[1] << 8);
}

static uint32_t ld32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t ld64(const uint8_t *p)
{
	return (uint64_t)ld32(p) | (uint64_t)ld32(p + 4) << 32;
}

static float ldf32(const uint8_t *p)
{
	uint32_t bits = ld32(p);
	float f;

	memcpy(&f, &bits, sizeof(f));
	return f;
}

static void st16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static void st32(uint8_t *p, uint32_t v)
{
	for (int i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

static void st64(uint8_t *p, uint64_t v)
{
	st32(p, (uint32_t)v);
	st32(p + 4, (uint32_t)(v >> 32));
}

static void stf32(uint8_t *p, float f)
{
	uint32_t bits;

	memcpy(&bits, &f, sizeof(bits));
	st32(p, bits);
}

static uint64_t align_up(uint64_t x, uint64_t a)
{
	return (x + a - 1) / a * a;
}

static bool is_pow2(uint64_t x)
{
	return x && !(x & (x - 1));
}

static bool all_zero(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (p[i])
			return false;
	return true;
}

static uint64_t hash(const void *p, size_t n, uint64_t seed)
{
	return XXH3_64bits_withSeed(p, n, seed);
}

const char *nl_img_kind_name(uint32_t kind)
{
	switch (kind) {
	case NL_IMG_SEC_DENSE: return "dense";
	case NL_IMG_SEC_FFN: return "ffn";
	case NL_IMG_SEC_PLACEMENT: return "placement";
	case NL_IMG_SEC_CHECKSUMS: return "checksums";
	}
	return "unknown";
}

/* ---- configuration, layout, element types ---- */

uint32_t nl_img_dtype_size(enum nl_img_dtype dtype)
{
	switch (dtype) {
	case NL_IMG_F32: return 4;
	case NL_IMG_F16: return 2;
	case NL_IMG_BF16: return 2;
	}
	return 0;
}

static uint32_t bundle_matrices(uint32_t flags)
{
	return !!(flags & NL_IMG_BUNDLE_GATE) + !!(flags & NL_IMG_BUNDLE_UP) +
	       !!(flags & NL_IMG_BUNDLE_DOWN);
}

uint64_t nl_img_bundle_bytes(const struct nl_img_config *config)
{
	return (uint64_t)bundle_matrices(config->bundle_flags) * config->dim *
	       nl_img_dtype_size(config->dtype);
}

void nl_img_config_from_model(struct nl_img_config *config, const struct nl_model_config *model,
			      enum nl_img_dtype dtype)
{
	memset(config, 0, sizeof(*config));
	config->dim = model->dim;
	config->hidden_dim = model->hidden_dim;
	config->n_layers = model->n_layers;
	config->n_heads = model->n_heads;
	config->n_kv_heads = model->n_kv_heads;
	config->vocab_size = model->vocab_size;
	config->seq_len = model->seq_len;
	config->rms_eps = model->rms_eps;
	config->rope_theta = model->rope_theta;
	config->shared_classifier = model->shared_classifier;
	config->act = NL_IMG_ACT_SILU;
	config->dtype = dtype;
	config->bundle_flags = NL_IMG_BUNDLE_ALL;
	snprintf(config->name, sizeof(config->name), "%s", model->name);
}

/*
 * Shared by the writer (err NL_E_INVAL, what "configuration") and the parser
 * (err NL_E_FORMAT, what "'<file>': header"). Element type and activation
 * are checked by the callers, which pick their own codes.
 */
static int check_u32(int err, const char *what, const char *field, uint32_t v,
		     uint32_t lo, uint32_t hi, const char *fix)
{
	if (v < lo || v > hi)
		return nl_diag(err, "%s field '%s' is %u, expected %u..%u; %s",
			       what, field, v, lo, hi, fix);
	return 0;
}

static int check_config(const struct nl_img_config *c, int err, const char *what, const char *fix)
{
	int ret;

	if ((ret = check_u32(err, what, "dim", c->dim, 1, MAX_DIM, fix)) ||
	    (ret = check_u32(err, what, "hidden_dim", c->hidden_dim, 1, MAX_HIDDEN, fix)) ||
	    (ret = check_u32(err, what, "n_layers", c->n_layers, 1, NL_MAX_LAYERS, fix)) ||
	    (ret = check_u32(err, what, "n_heads", c->n_heads, 1, c->dim, fix)) ||
	    (ret = check_u32(err, what, "n_kv_heads", c->n_kv_heads, 1, c->n_heads, fix)) ||
	    (ret = check_u32(err, what, "vocab_size", c->vocab_size, 1, MAX_VOCAB, fix)) ||
	    (ret = check_u32(err, what, "seq_len", c->seq_len, 1, MAX_SEQ_LEN, fix)))
		return ret;
	if (c->dim % c->n_heads)
		return nl_diag(err, "%s field 'dim' is %u, not a multiple of n_heads %u; %s",
			       what, c->dim, c->n_heads, fix);
	if (c->n_heads % c->n_kv_heads)
		return nl_diag(err, "%s field 'n_heads' is %u, not a multiple of n_kv_heads %u; %s",
			       what, c->n_heads, c->n_kv_heads, fix);
	if (!isfinite(c->rms_eps) || !(c->rms_eps > 0.0f) || c->rms_eps >= 1.0f)
		return nl_diag(err, "%s field 'rms_eps' is %g, expected a number in (0, 1); %s",
			       what, (double)c->rms_eps, fix);
	if (!isfinite(c->rope_theta) || !(c->rope_theta > 0.0f))
		return nl_diag(err, "%s field 'rope_theta' is %g, expected a positive number; %s",
			       what, (double)c->rope_theta, fix);
	if ((c->bundle_flags & ~NL_IMG_BUNDLE_ALL) ||
	    (c->bundle_flags & (NL_IMG_BUNDLE_UP | NL_IMG_BUNDLE_DOWN)) !=
		    (NL_IMG_BUNDLE_UP | NL_IMG_BUNDLE_DOWN))
		return nl_diag(err, "%s field 'bundle_flags' is 0x%x, expected 0x6 (up, down) or 0x7 (gate, up, down); %s",
			       what, c->bundle_flags, fix);
	return 0;
}

int nl_img_config_check(const struct nl_img_config *c)
{
	const char *fix = "fix the model configuration";
	int ret;

	ret = check_config(c, NL_E_INVAL, "image configuration", fix);
	if (ret)
		return ret;
	if (!nl_img_dtype_size(c->dtype))
		return nl_diag(NL_E_INVAL, "image configuration field 'dtype' is %d, expected 0 (F32), 1 (F16) or 2 (BF16)",
			       (int)c->dtype);
	if ((unsigned)c->act > NL_IMG_ACT_GELU)
		return nl_diag(NL_E_INVAL, "image configuration field 'act' is %d, expected 0 (silu), 1 (relu) or 2 (gelu)",
			       (int)c->act);
	if (!memchr(c->name, '\0', sizeof(c->name)))
		return nl_diag(NL_E_INVAL, "image configuration field 'name' is not NUL-terminated within %d bytes",
			       NL_NAME_MAX);
	return 0;
}

int nl_img_dense_layout(const struct nl_img_config *c, struct nl_img_dense_layout *out)
{
	uint64_t esize = nl_img_dtype_size(c->dtype), dim = c->dim, pos;
	uint64_t kv_dim, norm_bytes = align_up(dim * 4, NL_IMG_DENSE_ALIGN);

	memset(out, 0, sizeof(*out));
	if (!esize || !c->dim || !c->n_heads || c->dim % c->n_heads)
		return nl_diag(NL_E_INVAL, "dense layout: invalid configuration (dim %u, n_heads %u, dtype %d)",
			       c->dim, c->n_heads, (int)c->dtype);
	kv_dim = dim / c->n_heads * c->n_kv_heads;
	out->token_embedding = 0;
	pos = align_up((uint64_t)c->vocab_size * dim * esize, NL_IMG_DENSE_ALIGN);
	out->layers = pos;
	out->attn_norm = 0;
	out->wq = norm_bytes;
	out->wk = out->wq + align_up(dim * dim * esize, NL_IMG_DENSE_ALIGN);
	out->wv = out->wk + align_up(kv_dim * dim * esize, NL_IMG_DENSE_ALIGN);
	out->wo = out->wv + align_up(kv_dim * dim * esize, NL_IMG_DENSE_ALIGN);
	out->ffn_norm = out->wo + align_up(dim * dim * esize, NL_IMG_DENSE_ALIGN);
	out->layer_stride = out->ffn_norm + norm_bytes;
	pos += out->layer_stride * c->n_layers;
	out->final_norm = pos;
	if (c->shared_classifier) {
		out->classifier = out->token_embedding;
		out->size = pos + dim * 4;
	} else {
		out->classifier = pos + norm_bytes;
		out->size = out->classifier + (uint64_t)c->vocab_size * dim * esize;
	}
	return 0;
}

/* ---- element types ---- */

static uint16_t f32_to_f16(float f)
{
	uint32_t x, sign, exp, man, half, rem;
	int e;

	memcpy(&x, &f, sizeof(x));
	sign = (x >> 16) & 0x8000;
	exp = (x >> 23) & 0xff;
	man = x & 0x7fffff;
	if (exp == 0xff)        /* inf stays inf, NaN stays a quiet NaN */
		return (uint16_t)(sign | 0x7c00 | (man ? 0x200 | (man >> 13) : 0));
	e = (int)exp - 127 + 15;
	if (e >= 31)
		return (uint16_t)(sign | 0x7c00);
	if (e <= 0) {           /* binary16 subnormal: value = m * 2^-24 */
		uint32_t shift, mid;

		if (e < -10)
			return (uint16_t)sign;
		man |= 0x800000;
		shift = (uint32_t)(14 - e);
		half = man >> shift;
		rem = man & ((1u << shift) - 1);
		mid = 1u << (shift - 1);
		if (rem > mid || (rem == mid && (half & 1)))
			half++;
		return (uint16_t)(sign | half);
	}
	half = (uint32_t)e << 10 | man >> 13;
	rem = man & 0x1fff;
	/* A carry out of the mantissa correctly bumps the exponent (up to inf). */
	if (rem > 0x1000 || (rem == 0x1000 && (half & 1)))
		half++;
	return (uint16_t)(sign | half);
}

static float f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, x;
	float f;

	if (exp == 0) {
		f = (float)man * 0x1p-24f;
		memcpy(&x, &f, sizeof(x));
		x |= sign;
	} else if (exp == 31) {
		x = sign | 0x7f800000 | man << 13;
	} else {
		x = sign | (exp + 112) << 23 | man << 13;
	}
	memcpy(&f, &x, sizeof(f));
	return f;
}

static uint16_t f32_to_bf16(float f)
{
	uint32_t x;

	memcpy(&x, &f, sizeof(x));
	if ((x & 0x7fffffff) > 0x7f800000)
		return (uint16_t)(x >> 16 | 0x40);
	x += 0x7fff + ((x >> 16) & 1);
	return (uint16_t)(x >> 16);
}

static float bf16_to_f32(uint16_t h)
{
	uint32_t x = (uint32_t)h << 16;
	float f;

	memcpy(&f, &x, sizeof(f));
	return f;
}

void nl_img_encode(enum nl_img_dtype dtype, void *dst, const float *src, size_t n)
{
	uint8_t *out = dst;

	for (size_t i = 0; i < n; i++) {
		switch (dtype) {
		case NL_IMG_F32: stf32(out + 4 * i, src[i]); break;
		case NL_IMG_F16: st16(out + 2 * i, f32_to_f16(src[i])); break;
		case NL_IMG_BF16: st16(out + 2 * i, f32_to_bf16(src[i])); break;
		}
	}
}

void nl_img_decode(enum nl_img_dtype dtype, float *dst, const void *src, size_t n)
{
	const uint8_t *in = src;

	for (size_t i = 0; i < n; i++) {
		switch (dtype) {
		case NL_IMG_F32: dst[i] = ldf32(in + 4 * i); break;
		case NL_IMG_F16: dst[i] = f16_to_f32(ld16(in + 2 * i)); break;
		case NL_IMG_BF16: dst[i] = bf16_to_f32(ld16(in + 2 * i)); break;
		}
	}
}

int nl_img_pack_dense(const struct nl_img_config *c, const struct nl_model_weights *w,
		      void *dst, uint64_t size)
{
	struct nl_img_dense_layout lay;
	uint8_t *out = dst;
	uint64_t dim = c->dim, kv_dim, vd;
	int ret;

	ret = nl_img_dense_layout(c, &lay);
	if (ret)
		return ret;
	if (size != lay.size)
		return nl_diag(NL_E_INVAL, "dense buffer has %llu bytes, expected %llu",
			       (unsigned long long)size, (unsigned long long)lay.size);
	kv_dim = dim / c->n_heads * c->n_kv_heads;
	vd = (uint64_t)c->vocab_size * dim;
	memset(out, 0, size);
	nl_img_encode(c->dtype, out + lay.token_embedding, w->token_embedding, vd);
	for (uint32_t l = 0; l < c->n_layers; l++) {
		const struct nl_layer_weights *lw = &w->layers[l];
		uint8_t *base = out + lay.layers + l * lay.layer_stride;

		nl_img_encode(NL_IMG_F32, base + lay.attn_norm, lw->attn_norm, dim);
		nl_img_encode(c->dtype, base + lay.wq, lw->wq, dim * dim);
		nl_img_encode(c->dtype, base + lay.wk, lw->wk, kv_dim * dim);
		nl_img_encode(c->dtype, base + lay.wv, lw->wv, kv_dim * dim);
		nl_img_encode(c->dtype, base + lay.wo, lw->wo, dim * dim);
		nl_img_encode(NL_IMG_F32, base + lay.ffn_norm, lw->ffn_norm, dim);
	}
	nl_img_encode(NL_IMG_F32, out + lay.final_norm, w->final_norm, dim);
	if (!c->shared_classifier)
		nl_img_encode(c->dtype, out + lay.classifier, w->classifier, vd);
	return 0;
}

void nl_img_pack_bundle(const struct nl_img_config *c, const float *w_gate, const float *w_up,
			const float *w_down, uint32_t neuron, void *dst)
{
	uint32_t esize = nl_img_dtype_size(c->dtype), dim = c->dim;
	uint8_t *out = dst;

	if (c->bundle_flags & NL_IMG_BUNDLE_GATE) {
		nl_img_encode(c->dtype, out, w_gate + (size_t)neuron * dim, dim);
		out += (size_t)dim * esize;
	}
	nl_img_encode(c->dtype, out, w_up + (size_t)neuron * dim, dim);
	out += (size_t)dim * esize;
	/* The down column is strided in w_down [dim, hidden]; gather it. */
	for (uint32_t i = 0; i < dim; i++)
		nl_img_encode(c->dtype, out + (size_t)i * esize,
			      w_down + (size_t)i * c->hidden_dim + neuron, 1);
}

/* ---- header and section table encoding (shared by writer and tests) ---- */

static void encode_header(uint8_t *h, const struct nl_img_config *c, uint64_t file_size,
			  uint32_t n_sections, uint32_t block_size, uint64_t checksums_hash,
			  uint64_t table_hash)
{
	memset(h, 0, NL_IMG_HEADER_SIZE);
	memcpy(h + H_MAGIC, NL_IMG_MAGIC, NL_IMG_MAGIC_SIZE);
	st16(h + H_MAJOR, NL_IMG_VERSION_MAJOR);
	st16(h + H_MINOR, NL_IMG_VERSION_MINOR);
	st32(h + H_HEADER_SIZE, NL_IMG_HEADER_SIZE);
	st64(h + H_FILE_SIZE, file_size);
	st64(h + H_TABLE_OFFSET, NL_IMG_HEADER_SIZE);
	st32(h + H_SECTION_COUNT, n_sections);
	st32(h + H_ENTRY_SIZE, NL_IMG_ENTRY_SIZE);
	st32(h + H_BLOCK_SIZE, block_size);
	st32(h + H_BUNDLE_FLAGS, c->bundle_flags);
	st32(h + H_DIM, c->dim);
	st32(h + H_HIDDEN_DIM, c->hidden_dim);
	st32(h + H_N_LAYERS, c->n_layers);
	st32(h + H_N_HEADS, c->n_heads);
	st32(h + H_N_KV_HEADS, c->n_kv_heads);
	st32(h + H_VOCAB_SIZE, c->vocab_size);
	st32(h + H_SEQ_LEN, c->seq_len);
	stf32(h + H_RMS_EPS, c->rms_eps);
	stf32(h + H_ROPE_THETA, c->rope_theta);
	h[H_SHARED] = c->shared_classifier ? 1 : 0;
	h[H_ACT] = (uint8_t)c->act;
	h[H_DTYPE] = (uint8_t)c->dtype;
	memcpy(h + H_NAME, c->name, strnlen(c->name, H_NAME_SIZE - 1));
	st64(h + H_CHECKSUMS_HASH, checksums_hash);
	st64(h + H_TABLE_HASH, table_hash);
	st64(h + H_HEADER_HASH, hash(h, H_HEADER_HASH, 0));
}

static void encode_entry(uint8_t *e, const struct nl_img_section *s)
{
	memset(e, 0, NL_IMG_ENTRY_SIZE);
	st32(e + E_KIND, s->kind);
	st32(e + E_LAYER, s->layer);
	st64(e + E_OFFSET, s->offset);
	st64(e + E_LENGTH, s->length);
	st32(e + E_FLAGS, s->flags);
	st32(e + E_STRIDE, s->stride);
	st64(e + E_COUNT, s->count);
	st64(e + E_CSUM_FIRST, s->csum_first);
}

/* ---- writer ---- */

struct nl_img_writer {
	char path[PATH_MAX];
	char tmp[PATH_MAX];
	int fd;
	struct nl_img_config config;
	uint32_t block_size;
	uint64_t bundle_bytes;
	uint64_t dense_size;
	uint64_t pos;                    /* end of what was written so far */
	struct nl_img_section *sections; /* [n_max] in table (= file) order */
	uint32_t n_sections, n_max;
	uint64_t *csums;                 /* block checksums in table order */
	uint64_t n_csums, cap_csums;
	bool have_dense;                 /* the dense section was started */
	bool *have_layer;                /* [n_layers] */
	/* The section being streamed, between sec_begin() and sec_end(). */
	bool open;
	struct nl_img_section cur;
	uint64_t cur_length;             /* bytes it will have */
	uint64_t cur_written;
	XXH3_state_t *block_state;       /* hash of the current block */
	uint32_t *perms;                 /* [n_layers * hidden_dim] */
};

static int write_all(int fd, const void *buf, uint64_t len, uint64_t offset)
{
	const uint8_t *p = buf;

	while (len) {
		size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
		ssize_t n = pwrite(fd, p, chunk, (off_t)offset);

		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (uint64_t)n;
		offset += (uint64_t)n;
	}
	return 0;
}

/*
 * Sections are streamed: sec_begin() places the next section at a multiple of
 * align, sec_append() writes and hashes its bytes block by block (XXH3
 * streaming state, seeded with each block's file offset), sec_end() hashes the
 * short last block and records the table entry.
 */
static int sec_begin(struct nl_img_writer *w, uint32_t kind, uint32_t layer, uint64_t align,
		     uint32_t flags, uint32_t stride, uint64_t count, uint64_t length)
{
	uint64_t n_blocks = (length + w->block_size - 1) / w->block_size;

	if (w->open)
		return nl_diag(NL_E_INVAL, "'%s': the %s section is still incomplete (%llu of %llu bytes written)",
			       w->path, nl_img_kind_name(w->cur.kind),
			       (unsigned long long)w->cur_written, (unsigned long long)w->cur_length);
	if (w->n_sections >= w->n_max)
		return nl_diag(NL_E_INVAL, "'%s': too many sections", w->path);
	if (w->n_csums + n_blocks > w->cap_csums) {
		uint64_t cap = (w->n_csums + n_blocks) * 2;
		uint64_t *grown = realloc(w->csums, cap * sizeof(*grown));

		if (!grown)
			return nl_diag(-ENOMEM, "'%s': out of memory for %llu checksums", w->path,
				       (unsigned long long)cap);
		w->csums = grown;
		w->cap_csums = cap;
	}
	/* The gap before the section stays a hole: it reads as zeros. */
	w->cur = (struct nl_img_section){
		.index = w->n_sections, .kind = kind, .layer = layer,
		.offset = align_up(w->pos, align), .length = 0, .flags = flags,
		.stride = stride, .count = count,
		.csum_first = kind == NL_IMG_SEC_CHECKSUMS ? 0 : w->n_csums,
	};
	w->cur_length = length;
	w->cur_written = 0;
	w->open = true;
	return 0;
}

static int sec_append(struct nl_img_writer *w, const void *data, uint64_t len)
{
	const uint8_t *p = data;
	uint64_t bs = w->block_size;
	int ret;

	if (len > w->cur_length - w->cur_written)
		return nl_diag(NL_E_INVAL, "'%s': %llu more bytes for the %s section, which has room for %llu",
			       w->path, (unsigned long long)len, nl_img_kind_name(w->cur.kind),
			       (unsigned long long)(w->cur_length - w->cur_written));
	ret = write_all(w->fd, data, len, w->cur.offset + w->cur_written);
	if (ret)
		return nl_diag(ret, "'%s': writing %s section at offset %llu: %s", w->tmp,
			       nl_img_kind_name(w->cur.kind),
			       (unsigned long long)(w->cur.offset + w->cur_written), nl_strerror(ret));
	while (len && w->cur.kind != NL_IMG_SEC_CHECKSUMS) {
		uint64_t in_block = w->cur_written % bs, take = bs - in_block;

		if (take > len)
			take = len;
		if (!in_block)
			XXH3_64bits_reset_withSeed(w->block_state, w->cur.offset + w->cur_written);
		XXH3_64bits_update(w->block_state, p, (size_t)take);
		w->cur_written += take;
		p += take;
		len -= take;
		if (w->cur_written % bs == 0)
			w->csums[w->n_csums++] = XXH3_64bits_digest(w->block_state);
	}
	w->cur_written += len;  /* the checksum section is not hashed block by block */
	return 0;
}

static void sec_end(struct nl_img_writer *w)
{
	if (w->cur.kind != NL_IMG_SEC_CHECKSUMS && w->cur_written % w->block_size)
		w->csums[w->n_csums++] = XXH3_64bits_digest(w->block_state);
	w->cur.length = w->cur_written;
	w->sections[w->n_sections++] = w->cur;
	w->pos = w->cur.offset + w->cur.length;
	w->open = false;
}

/* A whole section in one call. */
static int writer_add(struct nl_img_writer *w, uint32_t kind, uint32_t layer, uint64_t align,
		      uint32_t flags, uint32_t stride, uint64_t count, const void *data,
		      uint64_t length)
{
	int ret;

	ret = sec_begin(w, kind, layer, align, flags, stride, count, length);
	if (!ret)
		ret = sec_append(w, data, length);
	if (ret)
		return ret;
	sec_end(w);
	return 0;
}

int nl_img_create(struct nl_img_writer **out, const char *path,
		  const struct nl_img_config *config, uint32_t block_size)
{
	struct nl_img_writer *w;
	struct nl_img_dense_layout lay;
	int ret;

	*out = NULL;
	ret = nl_img_config_check(config);
	if (ret)
		return nl_diag_prefix(ret, "'%s': ", path);
	if (!block_size)
		block_size = NL_IMG_BLOCK_SIZE;
	if (!is_pow2(block_size) || block_size < NL_IMG_BLOCK_MIN || block_size > NL_IMG_BLOCK_MAX)
		return nl_diag(NL_E_INVAL, "'%s': block size %u, expected a power of two in %u..%u",
			       path, block_size, NL_IMG_BLOCK_MIN, NL_IMG_BLOCK_MAX);
	if (strlen(path) >= sizeof(w->path))
		return nl_diag(-ENAMETOOLONG, "'%s': path too long", path);
	w = calloc(1, sizeof(*w));
	if (!w)
		return nl_diag(-ENOMEM, "'%s': out of memory", path);
	w->fd = -1;
	strcpy(w->path, path);
	ret = nl_tmp_path(w->tmp, sizeof(w->tmp), path);
	if (ret) {
		nl_diag(ret, "'%s': temporary path too long", path);
		goto out_free;
	}
	w->config = *config;
	w->block_size = block_size;
	w->bundle_bytes = nl_img_bundle_bytes(config);
	nl_img_dense_layout(config, &lay);
	w->dense_size = lay.size;
	w->n_max = 2 * config->n_layers + 2;
	w->sections = calloc(w->n_max, sizeof(*w->sections));
	w->have_layer = calloc(config->n_layers, sizeof(*w->have_layer));
	w->perms = calloc((size_t)config->n_layers * config->hidden_dim, sizeof(*w->perms));
	w->block_state = XXH3_createState();
	if (!w->sections || !w->have_layer || !w->perms || !w->block_state) {
		ret = nl_diag(-ENOMEM, "'%s': out of memory", path);
		goto out_free;
	}
	w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (w->fd < 0) {
		ret = -errno;
		nl_diag(ret, "'%s': cannot create: %s", w->tmp, nl_strerror(ret));
		goto out_free;
	}
	/* Header and table are written last, at offset 0, by nl_img_finish(). */
	w->pos = NL_IMG_HEADER_SIZE + (uint64_t)w->n_max * NL_IMG_ENTRY_SIZE;
	*out = w;
	return 0;

out_free:
	free(w->sections);
	free(w->have_layer);
	free(w->perms);
	if (w->block_state)
		XXH3_freeState(w->block_state);
	free(w);
	return ret;
}

int nl_img_write_dense(struct nl_img_writer *w, const void *part, uint64_t size)
{
	int ret;

	if (!w->have_dense || !w->open || w->cur.kind != NL_IMG_SEC_DENSE) {
		if (w->have_dense)
			return nl_diag(NL_E_INVAL, "'%s': the dense section was already written", w->path);
		ret = sec_begin(w, NL_IMG_SEC_DENSE, NL_IMG_NO_LAYER, NL_IMG_DENSE_ALIGN, 0, 0, 0,
				w->dense_size);
		if (ret)
			return ret;
		w->have_dense = true;
	}
	ret = sec_append(w, part, size);
	if (ret)
		return ret;
	if (w->cur_written == w->cur_length)
		sec_end(w);
	return 0;
}

int nl_img_add_dense(struct nl_img_writer *w, const void *blob, uint64_t size)
{
	if (w->have_dense)
		return nl_diag(NL_E_INVAL, "'%s': the dense section was already added", w->path);
	if (size != w->dense_size)
		return nl_diag(NL_E_INVAL, "'%s': dense blob has %llu bytes, expected %llu (nl_img_dense_layout)",
			       w->path, (unsigned long long)size, (unsigned long long)w->dense_size);
	return nl_img_write_dense(w, blob, size);
}

int nl_img_add_ffn_layer(struct nl_img_writer *w, uint32_t layer, const uint32_t *perm,
			 const void *bundles, uint64_t size)
{
	uint32_t n = w->config.hidden_dim;
	uint32_t *dst;
	bool *seen;
	int ret = 0;

	if (layer >= w->config.n_layers)
		return nl_diag(NL_E_INVAL, "'%s': layer %u out of range, the model has %u layers",
			       w->path, layer, w->config.n_layers);
	if (w->have_layer[layer])
		return nl_diag(NL_E_INVAL, "'%s': layer %u was already added", w->path, layer);
	if (size != (uint64_t)n * w->bundle_bytes)
		return nl_diag(NL_E_INVAL, "'%s': layer %u bundles have %llu bytes, expected %llu (%u bundles of %llu)",
			       w->path, layer, (unsigned long long)size,
			       (unsigned long long)n * w->bundle_bytes, n,
			       (unsigned long long)w->bundle_bytes);
	seen = calloc(n, sizeof(*seen));
	if (!seen)
		return nl_diag(-ENOMEM, "'%s': out of memory", w->path);
	for (uint32_t p = 0; p < n; p++) {
		if (perm[p] >= n || seen[perm[p]]) {
			ret = nl_diag(NL_E_INVAL, "'%s': layer %u placement is not a permutation: position %u holds %u",
				      w->path, layer, p, perm[p]);
			goto out_free;
		}
		seen[perm[p]] = true;
	}
	ret = writer_add(w, NL_IMG_SEC_FFN, layer, NL_IMG_FFN_ALIGN, w->config.bundle_flags,
			 (uint32_t)w->bundle_bytes, n, bundles, size);
	if (ret)
		goto out_free;
	dst = w->perms + (size_t)layer * n;
	memcpy(dst, perm, (size_t)n * sizeof(*perm));
	w->have_layer[layer] = true;
out_free:
	free(seen);
	return ret;
}

static void writer_free(struct nl_img_writer *w)
{
	if (w->fd >= 0)
		close(w->fd);
	free(w->sections);
	free(w->csums);
	free(w->have_layer);
	free(w->perms);
	if (w->block_state)
		XXH3_freeState(w->block_state);
	free(w);
}

int nl_img_finish(struct nl_img_writer *w)
{
	uint32_t n = w->config.hidden_dim;
	uint8_t header[NL_IMG_HEADER_SIZE];
	uint8_t *buf = NULL, *table = NULL;
	uint64_t checksums_hash, table_hash, table_bytes;
	int ret;

	if (!w->have_dense || w->open) {
		ret = nl_diag(NL_E_MISSING, "'%s': the dense section was never added or is incomplete (%llu of %llu bytes)",
			      w->path, (unsigned long long)(w->open ? w->cur_written : 0),
			      (unsigned long long)w->dense_size);
		goto out_abort;
	}
	for (uint32_t l = 0; l < w->config.n_layers; l++) {
		if (!w->have_layer[l]) {
			ret = nl_diag(NL_E_MISSING, "'%s': FFN layer %u was never added", w->path, l);
			goto out_abort;
		}
	}
	buf = malloc((size_t)n * 4);
	if (!buf) {
		ret = nl_diag(-ENOMEM, "'%s': out of memory", w->path);
		goto out_abort;
	}
	for (uint32_t l = 0; l < w->config.n_layers; l++) {
		for (uint32_t p = 0; p < n; p++)
			st32(buf + 4 * (size_t)p, w->perms[(size_t)l * n + p]);
		ret = writer_add(w, NL_IMG_SEC_PLACEMENT, l, NL_IMG_DENSE_ALIGN, 0, 4, n, buf,
				 (uint64_t)n * 4);
		if (ret)
			goto out_abort;
	}
	free(buf);
	buf = malloc(w->n_csums * 8 + 1);
	if (!buf) {
		ret = nl_diag(-ENOMEM, "'%s': out of memory", w->path);
		goto out_abort;
	}
	for (uint64_t i = 0; i < w->n_csums; i++)
		st64(buf + 8 * i, w->csums[i]);
	checksums_hash = hash(buf, w->n_csums * 8, 0);
	ret = writer_add(w, NL_IMG_SEC_CHECKSUMS, NL_IMG_NO_LAYER, NL_IMG_DENSE_ALIGN, 0, 8,
			 w->n_csums, buf, w->n_csums * 8);
	if (ret)
		goto out_abort;

	table_bytes = (uint64_t)w->n_sections * NL_IMG_ENTRY_SIZE;
	table = calloc(1, table_bytes);
	if (!table) {
		ret = nl_diag(-ENOMEM, "'%s': out of memory", w->path);
		goto out_abort;
	}
	for (uint32_t i = 0; i < w->n_sections; i++)
		encode_entry(table + (size_t)i * NL_IMG_ENTRY_SIZE, &w->sections[i]);
	table_hash = hash(table, table_bytes, 0);
	encode_header(header, &w->config, w->pos, w->n_sections, w->block_size, checksums_hash,
		      table_hash);
	ret = write_all(w->fd, table, table_bytes, NL_IMG_HEADER_SIZE);
	if (!ret)
		ret = write_all(w->fd, header, sizeof(header), 0);
	if (!ret && ftruncate(w->fd, (off_t)w->pos) < 0)
		ret = -errno;
	if (ret) {
		nl_diag(ret, "'%s': writing header: %s", w->tmp, nl_strerror(ret));
		goto out_abort;
	}
	ret = nl_commit_tmp(w->tmp, w->path);
	if (ret) {
		nl_diag_prefix(ret, "'%s': ", w->path);
		goto out_abort;
	}
	free(buf);
	free(table);
	writer_free(w);
	return 0;

out_abort:
	free(buf);
	free(table);
	nl_img_abort(w);
	return ret;
}

void nl_img_abort(struct nl_img_writer *w)
{
	if (!w)
		return;
	if (w->fd >= 0)
		unlink(w->tmp);
	writer_free(w);
}

/* ---- parser ---- */

void nl_img_info_free(struct nl_img_info *info)
{
	if (!info)
		return;
	free(info->sections);
	free(info->ffn);
	free(info->placement);
	memset(info, 0, sizeof(*info));
}

static const char *const FIX = FIX_PACK;

/* Names a section in diagnostics: "section 3 (ffn, layer 1)". */
static const char *sec_name(char *buf, size_t size, const struct nl_img_section *s)
{
	if (s->layer == NL_IMG_NO_LAYER)
		snprintf(buf, size, "section %u (%s, kind %u)", s->index, nl_img_kind_name(s->kind),
			 s->kind);
	else
		snprintf(buf, size, "section %u (%s, kind %u, layer %u)", s->index,
			 nl_img_kind_name(s->kind), s->kind, s->layer);
	return buf;
}

static int parse_header(const uint8_t *h, size_t len, uint64_t file_size, const char *name,
			struct nl_img_info *info)
{
	struct nl_img_config *c = &info->config;
	uint64_t table_offset, table_end, stored, computed;
	uint32_t header_size, entry_size, n_sections, min_sections;
	char what[NL_NAME_MAX + 32];
	const uint8_t *nul;
	int ret;

	if (len < NL_IMG_MAGIC_SIZE) {
		if (memcmp(h, NL_IMG_MAGIC, len))
			return nl_diag(NL_E_MAGIC, "'%s': not an .nlimg image (the first bytes are not \"\\x89NLIMG\\r\\n\"); give the path of a file written by nl-pack",
				       name);
		return nl_diag(NL_E_TRUNCATED, "'%s': file is %llu bytes, shorter than the %d-byte magic; the file is truncated, %s",
			       name, (unsigned long long)file_size, NL_IMG_MAGIC_SIZE, FIX);
	}
	if (memcmp(h + H_MAGIC, NL_IMG_MAGIC, NL_IMG_MAGIC_SIZE))
		return nl_diag(NL_E_MAGIC, "'%s': not an .nlimg image (magic %02x %02x %02x %02x %02x %02x %02x %02x, expected 89 4e 4c 49 4d 47 0d 0a); give the path of a file written by nl-pack",
			       name, h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
	if (len < H_HEADER_SIZE)
		return nl_diag(NL_E_TRUNCATED, "'%s': file is %llu bytes, ends inside the version field; the file is truncated, %s",
			       name, (unsigned long long)file_size, FIX);
	info->major = ld16(h + H_MAJOR);
	info->minor = ld16(h + H_MINOR);
	if (info->major != NL_IMG_VERSION_MAJOR)
		return nl_diag(NL_E_VERSION, "'%s': header field 'major' is %u, this reader knows major version %d (any minor); %s",
			       name, info->major, NL_IMG_VERSION_MAJOR,
			       info->major > NL_IMG_VERSION_MAJOR ? "use a newer neuralink build" : FIX);
	if (len < NL_IMG_HEADER_SIZE)
		return nl_diag(NL_E_TRUNCATED, "'%s': file is %llu bytes, shorter than the %d-byte header; the file is truncated, %s",
			       name, (unsigned long long)file_size, NL_IMG_HEADER_SIZE, FIX);
	stored = ld64(h + H_HEADER_HASH);
	computed = hash(h, H_HEADER_HASH, 0);
	if (stored != computed)
		return nl_diag(NL_E_CHECKSUM, "'%s': header checksum mismatch at offset 0x%x (stored %016llx, computed %016llx); the file is damaged, %s",
			       name, H_HEADER_HASH, (unsigned long long)stored,
			       (unsigned long long)computed, FIX);
	header_size = ld32(h + H_HEADER_SIZE);
	if (header_size != NL_IMG_HEADER_SIZE)
		return nl_diag(NL_E_FORMAT, "'%s': header field 'header_size' is %u, expected %d; %s",
			       name, header_size, NL_IMG_HEADER_SIZE, FIX);
	if (h[H_RESERVED0] || !all_zero(h + H_RESERVED1, H_RESERVED1_SIZE))
		return nl_diag(NL_E_RESERVED, "'%s': reserved header bytes at offset %d or %d..%d are not zero; %s",
			       name, H_RESERVED0, H_RESERVED1, H_RESERVED1 + H_RESERVED1_SIZE - 1, FIX);
	info->file_size = ld64(h + H_FILE_SIZE);
	if (info->file_size > file_size)
		return nl_diag(NL_E_TRUNCATED, "'%s': file is %llu bytes, header field 'file_size' says %llu; the file is truncated, %s",
			       name, (unsigned long long)file_size,
			       (unsigned long long)info->file_size, FIX);
	if (info->file_size < file_size)
		return nl_diag(NL_E_FORMAT, "'%s': file is %llu bytes, header field 'file_size' says %llu (trailing bytes); %s",
			       name, (unsigned long long)file_size,
			       (unsigned long long)info->file_size, FIX);
	table_offset = ld64(h + H_TABLE_OFFSET);
	if (table_offset != NL_IMG_HEADER_SIZE)
		return nl_diag(NL_E_FORMAT, "'%s': header field 'table_offset' is %llu, expected %d; %s",
			       name, (unsigned long long)table_offset, NL_IMG_HEADER_SIZE, FIX);
	entry_size = ld32(h + H_ENTRY_SIZE);
	if (entry_size != NL_IMG_ENTRY_SIZE)
		return nl_diag(NL_E_FORMAT, "'%s': header field 'entry_size' is %u, expected %d; %s",
			       name, entry_size, NL_IMG_ENTRY_SIZE, FIX);
	info->block_size = ld32(h + H_BLOCK_SIZE);
	if (!is_pow2(info->block_size) || info->block_size < NL_IMG_BLOCK_MIN ||
	    info->block_size > NL_IMG_BLOCK_MAX)
		return nl_diag(NL_E_FORMAT, "'%s': header field 'block_size' is %u, expected a power of two in %u..%u; %s",
			       name, info->block_size, NL_IMG_BLOCK_MIN, NL_IMG_BLOCK_MAX, FIX);

	c->bundle_flags = ld32(h + H_BUNDLE_FLAGS);
	c->dim = ld32(h + H_DIM);
	c->hidden_dim = ld32(h + H_HIDDEN_DIM);
	c->n_layers = ld32(h + H_N_LAYERS);
	c->n_heads = ld32(h + H_N_HEADS);
	c->n_kv_heads = ld32(h + H_N_KV_HEADS);
	c->vocab_size = ld32(h + H_VOCAB_SIZE);
	c->seq_len = ld32(h + H_SEQ_LEN);
	c->rms_eps = ldf32(h + H_RMS_EPS);
	c->rope_theta = ldf32(h + H_ROPE_THETA);
	if (h[H_DTYPE] > NL_IMG_BF16)
		return nl_diag(NL_E_TYPE, "'%s': header field 'dtype' is %u, expected 0 (F32), 1 (F16) or 2 (BF16); %s",
			       name, h[H_DTYPE], FIX);
	c->dtype = (enum nl_img_dtype)h[H_DTYPE];
	if (h[H_ACT] > NL_IMG_ACT_GELU)
		return nl_diag(NL_E_FORMAT, "'%s': header field 'act' is %u, expected 0 (silu), 1 (relu) or 2 (gelu); %s",
			       name, h[H_ACT], FIX);
	c->act = (enum nl_img_act)h[H_ACT];
	if (h[H_SHARED] > 1)
		return nl_diag(NL_E_FORMAT, "'%s': header field 'shared_classifier' is %u, expected 0 or 1; %s",
			       name, h[H_SHARED], FIX);
	c->shared_classifier = h[H_SHARED];
	nul = memchr(h + H_NAME, 0, H_NAME_SIZE);
	if (!nul || !all_zero(nul, (size_t)(h + H_NAME + H_NAME_SIZE - nul)))
		return nl_diag(NL_E_FORMAT, "'%s': header field 'name' is not NUL-terminated and zero-padded within %d bytes; %s",
			       name, H_NAME_SIZE, FIX);
	memcpy(c->name, h + H_NAME, (size_t)(nul - (h + H_NAME)) + 1);
	snprintf(what, sizeof(what), "'%s': header", name);
	ret = check_config(c, NL_E_FORMAT, what, FIX);
	if (ret)
		return ret;

	info->checksums_hash = ld64(h + H_CHECKSUMS_HASH);
	n_sections = ld32(h + H_SECTION_COUNT);
	min_sections = 2 * c->n_layers + 2;
	if (n_sections < min_sections || n_sections > NL_IMG_MAX_SECTIONS)
		return nl_diag(NL_E_FORMAT, "'%s': header field 'section_count' is %u, expected %u..%d for %u layers; %s",
			       name, n_sections, min_sections, NL_IMG_MAX_SECTIONS, c->n_layers, FIX);
	table_end = NL_IMG_HEADER_SIZE + (uint64_t)n_sections * NL_IMG_ENTRY_SIZE;
	if (table_end > info->file_size)
		return nl_diag(NL_E_FORMAT, "'%s': section table of %u entries ends at %llu, beyond the end of the file (%llu bytes); %s",
			       name, n_sections, (unsigned long long)table_end,
			       (unsigned long long)info->file_size, FIX);
	info->n_sections = n_sections;
	return 0;
}

static int section_err(int err, const char *name, const struct nl_img_section *s,
		       const char *fmt, ...) __attribute__((format(printf, 4, 5)));

static int section_err(int err, const char *name, const struct nl_img_section *s,
		       const char *fmt, ...)
{
	char msg[512], sn[96];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	return nl_diag(err, "'%s': %s %s; %s", name, sec_name(sn, sizeof(sn), s), msg, FIX);
}

static int expect_u64(const char *name, const struct nl_img_section *s, const char *field,
		      uint64_t found, uint64_t expected)
{
	if (found != expected)
		return section_err(NL_E_SHAPE, name, s, "field '%s' is %llu, expected %llu", field,
				   (unsigned long long)found, (unsigned long long)expected);
	return 0;
}

static int check_entry(const struct nl_img_info *info, const struct nl_img_section *s,
		       uint64_t dense_size, uint64_t table_end, const char *name)
{
	const struct nl_img_config *c = &info->config;
	uint64_t bundle_bytes = nl_img_bundle_bytes(c);
	uint64_t align = 1;
	int ret;

	if (s->kind == 0)
		return section_err(NL_E_FORMAT, name, s, "has kind 0, which is never valid");
	if (s->offset > info->file_size || s->length > info->file_size - s->offset)
		return section_err(NL_E_FORMAT, name, s, "spans %llu..%llu, beyond the end of the file (%llu bytes)",
				   (unsigned long long)s->offset,
				   (unsigned long long)s->offset + s->length,
				   (unsigned long long)info->file_size);
	if (s->offset < table_end)
		return section_err(NL_E_FORMAT, name, s, "starts at %llu, inside the header or section table (which end at %llu)",
				   (unsigned long long)s->offset, (unsigned long long)table_end);
	switch (s->kind) {
	case NL_IMG_SEC_DENSE:
	case NL_IMG_SEC_CHECKSUMS:
		if (s->layer != NL_IMG_NO_LAYER)
			return section_err(NL_E_FORMAT, name, s, "field 'layer' is %u, expected 0xffffffff (no layer)",
					   s->layer);
		break;
	case NL_IMG_SEC_FFN:
	case NL_IMG_SEC_PLACEMENT:
		if (s->layer >= c->n_layers)
			return section_err(NL_E_FORMAT, name, s, "field 'layer' is %u, expected 0..%u",
					   s->layer, c->n_layers - 1);
		break;
	default:
		return 0;       /* unknown kinds: only the common rules apply */
	}
	switch (s->kind) {
	case NL_IMG_SEC_DENSE:
		align = NL_IMG_DENSE_ALIGN;
		if (s->flags || s->stride || s->count)
			return section_err(NL_E_RESERVED, name, s, "fields 'flags', 'stride', 'count' are %u, %u, %llu, expected 0",
					   s->flags, s->stride, (unsigned long long)s->count);
		if ((ret = expect_u64(name, s, "length", s->length, dense_size)))
			return ret;
		break;
	case NL_IMG_SEC_FFN:
		align = NL_IMG_FFN_ALIGN;
		if (s->flags != c->bundle_flags)
			return section_err(NL_E_FORMAT, name, s, "field 'flags' is 0x%x, expected the header's bundle_flags 0x%x",
					   s->flags, c->bundle_flags);
		if ((ret = expect_u64(name, s, "stride", s->stride, bundle_bytes)) ||
		    (ret = expect_u64(name, s, "count", s->count, c->hidden_dim)) ||
		    (ret = expect_u64(name, s, "length", s->length, bundle_bytes * c->hidden_dim)))
			return ret;
		break;
	case NL_IMG_SEC_PLACEMENT:
		align = NL_IMG_TABLE_ALIGN;
		if (s->flags)
			return section_err(NL_E_RESERVED, name, s, "field 'flags' is 0x%x, expected 0", s->flags);
		if ((ret = expect_u64(name, s, "stride", s->stride, 4)) ||
		    (ret = expect_u64(name, s, "count", s->count, c->hidden_dim)) ||
		    (ret = expect_u64(name, s, "length", s->length, 4ull * c->hidden_dim)))
			return ret;
		break;
	case NL_IMG_SEC_CHECKSUMS:
		align = NL_IMG_TABLE_ALIGN;
		if (s->flags)
			return section_err(NL_E_RESERVED, name, s, "field 'flags' is 0x%x, expected 0", s->flags);
		if ((ret = expect_u64(name, s, "stride", s->stride, 8)))
			return ret;
		if (s->csum_first)
			return section_err(NL_E_FORMAT, name, s, "field 'csum_first' is %llu, expected 0",
					   (unsigned long long)s->csum_first);
		break;
	}
	if (s->offset % align)
		return section_err(NL_E_FORMAT, name, s, "offset %llu is not a multiple of %llu",
				   (unsigned long long)s->offset, (unsigned long long)align);
	return 0;
}

static int cmp_offset(const void *a, const void *b)
{
	const struct nl_img_section *x = *(const struct nl_img_section *const *)a;
	const struct nl_img_section *y = *(const struct nl_img_section *const *)b;

	return x->offset < y->offset ? -1 : x->offset > y->offset;
}

static int parse_table(const uint8_t *buf, const char *name, struct nl_img_info *info)
{
	const struct nl_img_config *c = &info->config;
	const uint8_t *table = buf + NL_IMG_HEADER_SIZE;
	uint64_t table_bytes = (uint64_t)info->n_sections * NL_IMG_ENTRY_SIZE;
	uint64_t table_end = NL_IMG_HEADER_SIZE + table_bytes;
	uint64_t stored = ld64(buf + H_TABLE_HASH), computed = hash(table, table_bytes, 0);
	struct nl_img_dense_layout lay;
	struct nl_img_section **order = NULL;
	uint32_t n_order = 0;
	char sn[96];
	int ret;

	if (stored != computed)
		return nl_diag(NL_E_CHECKSUM, "'%s': section table checksum mismatch at offset 0x%x..0x%llx (stored %016llx, computed %016llx); the file is damaged, %s",
			       name, NL_IMG_HEADER_SIZE, (unsigned long long)table_end,
			       (unsigned long long)stored, (unsigned long long)computed, FIX);
	info->sections = calloc(info->n_sections, sizeof(*info->sections));
	info->ffn = malloc(c->n_layers * sizeof(*info->ffn));
	info->placement = malloc(c->n_layers * sizeof(*info->placement));
	order = malloc(info->n_sections * sizeof(*order));
	if (!info->sections || !info->ffn || !info->placement || !order) {
		ret = nl_diag(-ENOMEM, "'%s': out of memory for %u sections", name, info->n_sections);
		goto out;
	}
	memset(info->ffn, 0xff, c->n_layers * sizeof(*info->ffn));
	memset(info->placement, 0xff, c->n_layers * sizeof(*info->placement));
	info->dense = info->checksums = UINT32_MAX;
	nl_img_dense_layout(c, &lay);

	for (uint32_t i = 0; i < info->n_sections; i++) {
		const uint8_t *e = table + (size_t)i * NL_IMG_ENTRY_SIZE;
		struct nl_img_section *s = &info->sections[i];
		uint32_t *slot = NULL;

		s->index = i;
		s->kind = ld32(e + E_KIND);
		s->layer = ld32(e + E_LAYER);
		s->offset = ld64(e + E_OFFSET);
		s->length = ld64(e + E_LENGTH);
		s->flags = ld32(e + E_FLAGS);
		s->stride = ld32(e + E_STRIDE);
		s->count = ld64(e + E_COUNT);
		s->csum_first = ld64(e + E_CSUM_FIRST);
		if (!all_zero(e + E_RESERVED, E_RESERVED_SIZE)) {
			ret = section_err(NL_E_RESERVED, name, s, "reserved bytes at offset %llu..%llu are not zero",
					  (unsigned long long)(NL_IMG_HEADER_SIZE + (uint64_t)i * NL_IMG_ENTRY_SIZE + E_RESERVED),
					  (unsigned long long)(NL_IMG_HEADER_SIZE + (uint64_t)i * NL_IMG_ENTRY_SIZE + NL_IMG_ENTRY_SIZE - 1));
			goto out;
		}
		ret = check_entry(info, s, lay.size, table_end, name);
		if (ret)
			goto out;
		switch (s->kind) {
		case NL_IMG_SEC_DENSE: slot = &info->dense; break;
		case NL_IMG_SEC_CHECKSUMS: slot = &info->checksums; break;
		case NL_IMG_SEC_FFN: slot = &info->ffn[s->layer]; break;
		case NL_IMG_SEC_PLACEMENT: slot = &info->placement[s->layer]; break;
		}
		if (slot) {
			if (*slot != UINT32_MAX) {
				ret = section_err(NL_E_FORMAT, name, s, "duplicates section %u", *slot);
				goto out;
			}
			*slot = i;
		}
		if (s->kind != NL_IMG_SEC_CHECKSUMS) {
			/* Block checksums are stored in table order, skipping the checksum section. */
			if (s->csum_first != info->n_blocks) {
				ret = section_err(NL_E_FORMAT, name, s, "field 'csum_first' is %llu, expected %llu (blocks of the sections before it)",
						  (unsigned long long)s->csum_first,
						  (unsigned long long)info->n_blocks);
				goto out;
			}
			info->n_blocks += (s->length + info->block_size - 1) / info->block_size;
		}
		if (s->length)
			order[n_order++] = s;
	}
	if (info->dense == UINT32_MAX) {
		ret = nl_diag(NL_E_MISSING, "'%s': no dense section (kind %d) in the section table; %s",
			      name, NL_IMG_SEC_DENSE, FIX);
		goto out;
	}
	if (info->checksums == UINT32_MAX) {
		ret = nl_diag(NL_E_MISSING, "'%s': no checksum section (kind %d) in the section table; %s",
			      name, NL_IMG_SEC_CHECKSUMS, FIX);
		goto out;
	}
	for (uint32_t l = 0; l < c->n_layers; l++) {
		if (info->ffn[l] == UINT32_MAX || info->placement[l] == UINT32_MAX) {
			ret = nl_diag(NL_E_MISSING, "'%s': layer %u has no %s section in the section table; %s",
				      name, l, info->ffn[l] == UINT32_MAX ? "ffn" : "placement", FIX);
			goto out;
		}
	}
	{
		const struct nl_img_section *s = &info->sections[info->checksums];

		if ((ret = expect_u64(name, s, "count", s->count, info->n_blocks)) ||
		    (ret = expect_u64(name, s, "length", s->length, info->n_blocks * 8)))
			goto out;
	}
	qsort(order, n_order, sizeof(*order), cmp_offset);
	for (uint32_t i = 1; i < n_order; i++) {
		if (order[i]->offset < order[i - 1]->offset + order[i - 1]->length) {
			ret = section_err(NL_E_FORMAT, name, order[i], "at %llu..%llu overlaps %s at %llu..%llu",
					  (unsigned long long)order[i]->offset,
					  (unsigned long long)(order[i]->offset + order[i]->length),
					  sec_name(sn, sizeof(sn), order[i - 1]),
					  (unsigned long long)order[i - 1]->offset,
					  (unsigned long long)(order[i - 1]->offset + order[i - 1]->length));
			goto out;
		}
	}
	ret = 0;
out:
	free(order);
	return ret;
}

int nl_img_parse(const void *buf, size_t len, uint64_t file_size, const char *name,
		 struct nl_img_info *out)
{
	const uint8_t *p = buf;
	int ret;

	memset(out, 0, sizeof(*out));
	if (!name)
		name = "<memory>";
	if (len > file_size)
		len = (size_t)file_size;
	ret = parse_header(p, len, file_size, name, out);
	if (ret)
		goto out_fail;
	if ((uint64_t)len < NL_IMG_HEADER_SIZE + (uint64_t)out->n_sections * NL_IMG_ENTRY_SIZE) {
		ret = nl_diag(NL_E_TRUNCATED, "'%s': only %zu bytes available, the section table of %u entries ends at %llu; the file is truncated, %s",
			      name, len, out->n_sections,
			      (unsigned long long)(NL_IMG_HEADER_SIZE + (uint64_t)out->n_sections * NL_IMG_ENTRY_SIZE),
			      FIX);
		goto out_fail;
	}
	ret = parse_table(p, name, out);
	if (ret)
		goto out_fail;
	return 0;

out_fail:
	nl_img_info_free(out);
	return ret;
}

/* ---- reader ---- */

struct nl_img {
	char *name;
	int fd;                    /* -1 for memory images */
	const uint8_t *mem;        /* memory images */
	struct nl_img_info info;
	uint64_t bundle_bytes;
	uint64_t *csums;           /* [info.n_blocks] decoded checksum section */
	uint32_t *perm;            /* [n_layers * hidden_dim] */
	uint32_t *pos;             /* [n_layers * hidden_dim] inverse */
};

int nl_img_read(struct nl_img *img, uint64_t offset, void *buf, uint64_t len)
{
	uint8_t *p = buf;

	if (offset > img->info.file_size || len > img->info.file_size - offset)
		return nl_diag(NL_E_INVAL, "'%s': read of %llu bytes at %llu is beyond the end of the image (%llu bytes)",
			       img->name, (unsigned long long)len, (unsigned long long)offset,
			       (unsigned long long)img->info.file_size);
	if (img->mem) {
		memcpy(p, img->mem + offset, (size_t)len);
		return 0;
	}
	while (len) {
		size_t chunk = len > (1u << 30) ? (1u << 30) : (size_t)len;
		ssize_t n = pread(img->fd, p, chunk, (off_t)offset);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int err = -errno;

			return nl_diag(err, "'%s': read at offset %llu: %s", img->name,
				       (unsigned long long)offset, nl_strerror(err));
		}
		if (n == 0)
			return nl_diag(NL_E_TRUNCATED, "'%s': file ends at offset %llu, before its declared size %llu; %s",
				       img->name, (unsigned long long)offset,
				       (unsigned long long)img->info.file_size, FIX);
		p += n;
		len -= (uint64_t)n;
		offset += (uint64_t)n;
	}
	return 0;
}

/* Bytes of [offset, offset + len): a pointer into memory images, else read into scratch. */
static int img_bytes(struct nl_img *img, uint64_t offset, uint64_t len, uint8_t *scratch,
		     const uint8_t **out)
{
	int ret;

	if (img->mem) {
		*out = img->mem + offset;
		return 0;
	}
	ret = nl_img_read(img, offset, scratch, len);
	*out = scratch;
	return ret;
}

int nl_img_verify_section(struct nl_img *img, uint32_t index, uint64_t *bad_offset)
{
	const struct nl_img_info *info = &img->info;
	const struct nl_img_section *s;
	uint64_t n_blocks, chunk;
	uint8_t *scratch = NULL;
	const uint8_t *data;
	char sn[96];
	int ret = 0;

	if (index >= info->n_sections)
		return nl_diag(NL_E_INVAL, "'%s': section %u out of range (%u sections)", img->name,
			       index, info->n_sections);
	s = &info->sections[index];
	chunk = s->kind == NL_IMG_SEC_CHECKSUMS ? s->length :
		(s->length < info->block_size ? s->length : info->block_size);
	if (!img->mem) {
		scratch = malloc(chunk ? chunk : 1);
		if (!scratch)
			return nl_diag(-ENOMEM, "'%s': out of memory for a %llu-byte block", img->name,
				       (unsigned long long)chunk);
	}
	if (s->kind == NL_IMG_SEC_CHECKSUMS) {
		uint64_t computed;

		ret = img_bytes(img, s->offset, s->length, scratch, &data);
		if (ret)
			goto out;
		computed = hash(data, s->length, 0);
		if (computed != info->checksums_hash) {
			if (bad_offset)
				*bad_offset = s->offset;
			ret = nl_diag(NL_E_CHECKSUM, "'%s': %s checksum mismatch at offset 0x%llx (header stores %016llx, computed %016llx); the file is damaged, %s",
				      img->name, sec_name(sn, sizeof(sn), s),
				      (unsigned long long)s->offset,
				      (unsigned long long)info->checksums_hash,
				      (unsigned long long)computed, FIX);
		}
		goto out;
	}
	n_blocks = (s->length + info->block_size - 1) / info->block_size;
	for (uint64_t k = 0; k < n_blocks; k++) {
		uint64_t start = s->offset + k * info->block_size;
		uint64_t n = s->length - k * info->block_size;
		uint64_t stored = img->csums[s->csum_first + k], computed;

		if (n > info->block_size)
			n = info->block_size;
		ret = img_bytes(img, start, n, scratch, &data);
		if (ret)
			goto out;
		computed = hash(data, n, start);
		if (computed != stored) {
			if (bad_offset)
				*bad_offset = start;
			ret = nl_diag(NL_E_CHECKSUM, "'%s': %s checksum mismatch in block %llu at offset 0x%llx (stored %016llx, computed %016llx); the file is damaged, %s",
				      img->name, sec_name(sn, sizeof(sn), s), (unsigned long long)k,
				      (unsigned long long)start, (unsigned long long)stored,
				      (unsigned long long)computed, FIX);
			goto out;
		}
	}
out:
	free(scratch);
	return ret;
}

int nl_img_verify_all(struct nl_img *img, uint64_t *bad_offset)
{
	int ret = 0;

	for (uint32_t i = 0; i < img->info.n_sections && !ret; i++)
		ret = nl_img_verify_section(img, i, bad_offset);
	return ret;
}

/* Loads the checksum section, then every placement table (verified, inverted). */
static int load_tables(struct nl_img *img)
{
	const struct nl_img_info *info = &img->info;
	const struct nl_img_section *cs = &info->sections[info->checksums];
	uint32_t n = info->config.hidden_dim;
	size_t total = (size_t)info->config.n_layers * n;
	uint8_t *buf = NULL;
	int ret;

	ret = nl_img_verify_section(img, info->checksums, NULL);
	if (ret)
		return ret;
	buf = malloc(cs->length > 4ull * n ? cs->length + 1 : 4ull * n);
	img->csums = malloc(info->n_blocks * sizeof(*img->csums) + 1);
	img->perm = malloc(total * sizeof(*img->perm));
	img->pos = malloc(total * sizeof(*img->pos));
	if (!buf || !img->csums || !img->perm || !img->pos) {
		ret = nl_diag(-ENOMEM, "'%s': out of memory for the checksum and placement tables",
			      img->name);
		goto out;
	}
	ret = nl_img_read(img, cs->offset, buf, cs->length);
	if (ret)
		goto out;
	for (uint64_t i = 0; i < info->n_blocks; i++)
		img->csums[i] = ld64(buf + 8 * i);
	for (uint32_t l = 0; l < info->config.n_layers; l++) {
		const struct nl_img_section *ps = &info->sections[info->placement[l]];
		uint32_t *perm = img->perm + (size_t)l * n, *pos = img->pos + (size_t)l * n;

		ret = nl_img_verify_section(img, ps->index, NULL);
		if (ret)
			goto out;
		ret = nl_img_read(img, ps->offset, buf, ps->length);
		if (ret)
			goto out;
		memset(pos, 0xff, (size_t)n * sizeof(*pos));
		for (uint32_t p = 0; p < n; p++) {
			perm[p] = ld32(buf + 4 * (size_t)p);
			if (perm[p] >= n || pos[perm[p]] != UINT32_MAX) {
				ret = nl_diag(NL_E_FORMAT, "'%s': placement of layer %u is not a permutation: position %u holds neuron %u, %s; %s",
					      img->name, l, p, perm[p],
					      perm[p] >= n ? "out of range" : "already placed", FIX);
				goto out;
			}
			pos[perm[p]] = p;
		}
	}
out:
	free(buf);
	return ret;
}

static int img_open(struct nl_img **out, int fd, const uint8_t *mem, size_t mem_len,
		    const char *name)
{
	struct nl_img *img;
	uint8_t head[NL_IMG_HEADER_SIZE];
	uint8_t *table_buf = NULL;
	uint64_t file_size, avail;
	int ret;

	*out = NULL;
	img = calloc(1, sizeof(*img));
	if (!img || !(img->name = strdup(name))) {
		free(img);
		return nl_diag(-ENOMEM, "'%s': out of memory", name);
	}
	img->fd = fd;
	img->mem = mem;
	if (mem) {
		ret = nl_img_parse(mem, mem_len, mem_len, name, &img->info);
	} else {
		struct stat st;
		uint32_t n_sections;

		if (fstat(fd, &st) < 0) {
			ret = -errno;
			nl_diag(ret, "'%s': stat: %s", name, nl_strerror(ret));
			goto out_close;
		}
		if (S_ISDIR(st.st_mode)) {
			ret = nl_diag(-EISDIR, "'%s': is a directory, expected an .nlimg file", name);
			goto out_close;
		}
		file_size = (uint64_t)st.st_size;
		img->info.file_size = file_size;
		avail = file_size < NL_IMG_HEADER_SIZE ? file_size : NL_IMG_HEADER_SIZE;
		ret = nl_img_read(img, 0, head, avail);
		if (ret)
			goto out_close;
		/* Read the whole table in one go when the header announces a plausible one. */
		n_sections = avail == NL_IMG_HEADER_SIZE ? ld32(head + H_SECTION_COUNT) : 0;
		if (n_sections > NL_IMG_MAX_SECTIONS)
			n_sections = 0;
		avail = NL_IMG_HEADER_SIZE + (uint64_t)n_sections * NL_IMG_ENTRY_SIZE;
		if (avail > file_size)
			avail = file_size;
		table_buf = malloc(avail ? avail : 1);
		if (!table_buf) {
			ret = nl_diag(-ENOMEM, "'%s': out of memory", name);
			goto out_close;
		}
		ret = nl_img_read(img, 0, table_buf, avail);
		if (ret)
			goto out_close;
		ret = nl_img_parse(table_buf, (size_t)avail, file_size, name, &img->info);
		free(table_buf);
		table_buf = NULL;
	}
	if (ret)
		goto out_close;
	img->bundle_bytes = nl_img_bundle_bytes(&img->info.config);
	ret = load_tables(img);
	if (ret)
		goto out_close;
	*out = img;
	return 0;

out_close:
	free(table_buf);
	nl_img_close(img);
	return ret;
}

int nl_img_open(struct nl_img **out, const char *path)
{
	int fd, ret;

	*out = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		ret = -errno;
		return nl_diag(ret, "'%s': cannot open: %s", path, nl_strerror(ret));
	}
	return img_open(out, fd, NULL, 0, path);
}

int nl_img_open_mem(struct nl_img **out, const void *buf, size_t len, const char *name)
{
	static const uint8_t empty[1];

	return img_open(out, -1, len ? buf : empty, len, name ? name : "<memory>");
}

void nl_img_close(struct nl_img *img)
{
	if (!img)
		return;
	if (img->fd >= 0)
		close(img->fd);
	nl_img_info_free(&img->info);
	free(img->csums);
	free(img->perm);
	free(img->pos);
	free(img->name);
	free(img);
}

const struct nl_img_info *nl_img_get_info(const struct nl_img *img)
{
	return &img->info;
}

const struct nl_img_config *nl_img_get_config(const struct nl_img *img)
{
	return &img->info.config;
}

int nl_img_fd(const struct nl_img *img)
{
	return img->fd;
}

int nl_img_find_section(const struct nl_img *img, uint32_t kind, uint32_t layer,
			struct nl_img_section *out)
{
	for (uint32_t i = 0; i < img->info.n_sections; i++) {
		const struct nl_img_section *s = &img->info.sections[i];

		if (s->kind == kind && s->layer == layer) {
			*out = *s;
			return 0;
		}
	}
	return nl_diag(NL_E_MISSING, "'%s': no %s section (kind %u) for layer %u", img->name,
		       nl_img_kind_name(kind), kind, layer);
}

const uint32_t *nl_img_placement(const struct nl_img *img, uint32_t layer)
{
	if (layer >= img->info.config.n_layers)
		return NULL;
	return img->perm + (size_t)layer * img->info.config.hidden_dim;
}

const uint32_t *nl_img_position(const struct nl_img *img, uint32_t layer)
{
	if (layer >= img->info.config.n_layers)
		return NULL;
	return img->pos + (size_t)layer * img->info.config.hidden_dim;
}

int nl_img_bundle_range(const struct nl_img *img, uint32_t layer, uint32_t first, uint32_t count,
			uint64_t *offset, uint64_t *length)
{
	const struct nl_img_config *c = &img->info.config;
	const struct nl_img_section *s;

	if (layer >= c->n_layers || first > c->hidden_dim || count > c->hidden_dim - first)
		return nl_diag(NL_E_INVAL, "'%s': bundles %u..%llu of layer %u out of range (%u layers of %u bundles)",
			       img->name, first, (unsigned long long)first + count, layer,
			       c->n_layers, c->hidden_dim);
	s = &img->info.sections[img->info.ffn[layer]];
	*offset = s->offset + (uint64_t)first * img->bundle_bytes;
	*length = (uint64_t)count * img->bundle_bytes;
	return 0;
}

int nl_img_read_bundles(struct nl_img *img, uint32_t layer, uint32_t first, uint32_t count,
			void *buf)
{
	uint64_t offset, length;
	int ret;

	ret = nl_img_bundle_range(img, layer, first, count, &offset, &length);
	if (ret)
		return ret;
	return nl_img_read(img, offset, buf, length);
}
