/*
 * llama2.c checkpoints (github.com/karpathy/llama2.c), F32 only.
 *
 * Legacy "v0" (export.py legacy_export, run.c), little-endian:
 *   offset size  field
 *   0      4     int32 dim
 *   4      4     int32 hidden_dim
 *   8      4     int32 n_layers
 *   12     4     int32 n_heads
 *   16     4     int32 n_kv_heads
 *   20     4     int32 vocab_size; negative: the classifier is not shared
 *   24     4     int32 seq_len
 *   28     ...   F32 weights: token_embedding [V,D], rms_att [L,D], wq [L,D,D],
 *                wk [L,KV,D], wv [L,KV,D], wo [L,D,D], rms_ffn [L,D], w1 [L,H,D],
 *                w2 [L,D,H], w3 [L,H,D], rms_final [D],
 *                freq_cis_real [S,hs/2], freq_cis_imag [S,hs/2] (unused, skipped),
 *                then wcls [V,D] when not shared.
 *
 * Version 1 (export.py version1_export): a 256-byte header
 *   0      4     uint32 magic 0x616b3432 ("ak42" read as a little-endian word)
 *   4      4     int32 version = 1
 *   8      28    7 x int32 as above (vocab_size positive)
 *   36     1     uint8 shared_classifier
 *   37     219   zero padding (checked)
 *   256    ...   F32 weights: rms_att [L,D], rms_ffn [L,D], rms_final [D],
 *                token_embedding [V,D], wq, wk, wv, wo, w1, w2, w3 (each [L,...]),
 *                then wcls [V,D] when not shared. No RoPE tables.
 *
 * The file size must match the header exactly.
 */
#include "nl_model_internal.h"

#include <stdio.h>
#include <string.h>

#define L2C_MAGIC 0x616b3432u
#define L2C_V0_HEADER 28u
#define L2C_V1_HEADER 256u

static void describe(char *buf, size_t size, const struct nl_model_config *c)
{
	snprintf(buf, size, "dim %u, hidden_dim %u, n_layers %u, n_heads %u, n_kv_heads %u, "
		 "vocab_size %u, seq_len %u, %s classifier", c->dim, c->hidden_dim, c->n_layers,
		 c->n_heads, c->n_kv_heads, c->vocab_size, c->seq_len,
		 c->shared_classifier ? "shared" : "separate");
}

/* Next n floats of the arena, in file order. */
static const float *take(float **cursor, uint64_t n)
{
	const float *p = *cursor;

	*cursor += n;
	return p;
}

int nl_llama2c_parse(struct nl_model *m, const char *what, const uint8_t *data, size_t size)
{
	struct nl_model_config *c = &m->config;
	uint64_t D, H, L, KV, V, S, hs, payload, expect, header;
	int32_t hdr[7];
	char desc[256];
	bool v1 = false;
	float *cursor;
	int err;

	if (size < 4)
		return nl_diag(NL_E_TRUNCATED, "'%s': %zu bytes, too short for a llama2.c or GGUF "
			       "header", what, size);
	if (nl_le32(data) == L2C_MAGIC) {
		int32_t version;

		if (size < L2C_V1_HEADER)
			return nl_diag(NL_E_TRUNCATED, "'%s': llama2.c v1 header needs %u bytes, "
				       "the file has %zu", what, L2C_V1_HEADER, size);
		version = (int32_t)nl_le32(data + 4);
		if (version == 2)
			return nl_diag(NL_E_UNSUPPORTED, "'%s': llama2.c version 2 (int8 "
				       "quantised) checkpoints are not supported; export version "
				       "1 (F32) or convert to GGUF", what);
		if (version != 1)
			return nl_diag(NL_E_VERSION, "'%s': llama2.c header version is %d, this "
				       "reader knows version 1", what, version);
		for (int i = 0; i < 7; i++)
			hdr[i] = (int32_t)nl_le32(data + 8 + 4 * i);
		if (data[36] > 1)
			return nl_diag(NL_E_FORMAT, "'%s': shared_classifier flag is %u, expected "
				       "0 or 1", what, data[36]);
		for (size_t i = 37; i < L2C_V1_HEADER; i++)
			if (data[i])
				return nl_diag(NL_E_RESERVED, "'%s': llama2.c v1 header padding "
					       "byte %zu is 0x%02x, expected 0", what, i, data[i]);
		v1 = true;
		c->shared_classifier = data[36] == 1;
		if (hdr[5] <= 0)
			return nl_diag(NL_E_FORMAT, "'%s': vocab_size is %d, expected > 0", what,
				       hdr[5]);
		c->source = NL_MODEL_LLAMA2C_V1;
		header = L2C_V1_HEADER;
	} else {
		if (size < L2C_V0_HEADER)
			return nl_diag(NL_E_TRUNCATED, "'%s': %zu bytes, too short for a llama2.c "
				       "header (%u bytes)", what, size, L2C_V0_HEADER);
		for (int i = 0; i < 7; i++)
			hdr[i] = (int32_t)nl_le32(data + 4 * i);
		c->shared_classifier = hdr[5] > 0;
		if (hdr[5] < 0 && hdr[5] != INT32_MIN)
			hdr[5] = -hdr[5];
		c->source = NL_MODEL_LLAMA2C_V0;
		header = L2C_V0_HEADER;
	}
	for (int i = 0; i < 7; i++)
		if (hdr[i] <= 0)
			hdr[i] = 0;  /* check_config names the field */
	c->dim = (uint32_t)hdr[0];
	c->hidden_dim = (uint32_t)hdr[1];
	c->n_layers = (uint32_t)hdr[2];
	c->n_heads = (uint32_t)hdr[3];
	c->n_kv_heads = (uint32_t)hdr[4];
	c->vocab_size = (uint32_t)hdr[5];
	c->seq_len = (uint32_t)hdr[6];
	c->rms_eps = 1e-5f;
	c->rope_theta = 10000.0f;
	nl_model_stem(c->name, sizeof(c->name), what);
	err = nl_model_check_config(c, what);
	if (err) {
		/* Without a magic, an implausible header most likely means "not a checkpoint". */
		if (!v1)
			return nl_diag_prefix(NL_E_MAGIC, "not a GGUF or llama2.c checkpoint (no "
					      "GGUF/ak42 magic and an implausible legacy "
					      "header): ");
		return err;
	}

	D = c->dim;
	H = c->hidden_dim;
	L = c->n_layers;
	hs = D / c->n_heads;
	KV = hs * c->n_kv_heads;
	V = c->vocab_size;
	S = c->seq_len;
	payload = V * D + L * (2 * D + 2 * D * D + 2 * KV * D + 3 * H * D) + D;
	if (!v1)
		payload += S * hs;  /* freq_cis_real + freq_cis_imag, S x hs/2 each */
	if (!c->shared_classifier)
		payload += V * D;
	expect = header + payload * 4;
	describe(desc, sizeof(desc), c);
	if (size < expect)
		return nl_diag(NL_E_TRUNCATED, "'%s': file has %zu bytes, the llama2.c header "
			       "(%s) implies %llu; the file is truncated or the header is wrong",
			       what, size, desc, (unsigned long long)expect);
	if (size > expect)
		return nl_diag(NL_E_FORMAT, "'%s': file has %zu bytes, the llama2.c header (%s) "
			       "implies %llu (%llu bytes too many); wrong header or not F32", what,
			       size, desc, (unsigned long long)expect,
			       (unsigned long long)(size - expect));

	err = nl_model_alloc(m, payload);
	if (err)
		return err;
	nl_load_f32_le(m->arena, data + header, payload);
	cursor = m->arena;
	{
		const float *att_norm, *ffn_norm, *wq, *wk, *wv, *wo, *w1, *w2, *w3;

		if (v1) {
			att_norm = take(&cursor, L * D);
			ffn_norm = take(&cursor, L * D);
			m->weights.final_norm = take(&cursor, D);
			m->weights.token_embedding = take(&cursor, V * D);
		} else {
			m->weights.token_embedding = take(&cursor, V * D);
			att_norm = take(&cursor, L * D);
		}
		wq = take(&cursor, L * D * D);
		wk = take(&cursor, L * KV * D);
		wv = take(&cursor, L * KV * D);
		wo = take(&cursor, L * D * D);
		if (!v1)
			ffn_norm = take(&cursor, L * D);
		w1 = take(&cursor, L * H * D);
		w2 = take(&cursor, L * D * H);
		w3 = take(&cursor, L * H * D);
		if (!v1) {
			m->weights.final_norm = take(&cursor, D);
			take(&cursor, S * hs);  /* legacy RoPE tables: recomputed instead */
		}
		m->weights.classifier = c->shared_classifier ? m->weights.token_embedding :
			take(&cursor, V * D);
		for (uint64_t l = 0; l < L; l++) {
			struct nl_layer_weights *lw = &m->layers[l];

			lw->attn_norm = att_norm + l * D;
			lw->ffn_norm = ffn_norm + l * D;
			lw->wq = wq + l * D * D;
			lw->wk = wk + l * KV * D;
			lw->wv = wv + l * KV * D;
			lw->wo = wo + l * D * D;
			lw->w_gate = w1 + l * H * D;
			lw->w_down = w2 + l * D * H;
			lw->w_up = w3 + l * H * D;
		}
	}
	return 0;
}
