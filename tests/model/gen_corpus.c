/*
 * Writes the seed corpus of fuzz_model: tiny llama models (dim 32, one layer)
 * as GGUF in every supported tensor type, with an embedded vocabulary, as
 * llama2.c v0/v1 checkpoints, and a tiny tokenizer.bin. Built, never run by
 * the tests:  build/tests/model/gen_model_corpus tests/model/corpus
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "gguf_writer.h"
#include "nl_model_internal.h"

#define DIM 32
#define HIDDEN 32
#define VOCAB 12
#define SEQ 8

static const char *const pieces[VOCAB] = {
	"<unk>", "<s>", "</s>", "<0x0A>", "<0x20>", "\xe2\x96\x81", "a", "b",
	"\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab", "\xc3\xa9",
};
static const int32_t types[VOCAB] = { 2, 3, 3, 6, 6, 1, 1, 1, 1, 1, 1, 1 };
static const float scores[VOCAB] = { 0, 0, 0, 0, 0, -1, -2, -3, -4, -5, -6, -7 };

static struct nl_model *tiny_model(bool shared)
{
	struct nl_model *m = calloc(1, sizeof(*m));
	struct nl_model_config *c = &m->config;
	size_t D = DIM, H = HIDDEN, V = VOCAB, KV = DIM / 2, total;
	float *p;

	c->dim = DIM;
	c->hidden_dim = HIDDEN;
	c->n_layers = 1;
	c->n_heads = 4;
	c->n_kv_heads = 2;
	c->vocab_size = VOCAB;
	c->seq_len = SEQ;
	c->rms_eps = 1e-5f;
	c->rope_theta = 10000.0f;
	c->shared_classifier = shared;
	snprintf(c->name, sizeof(c->name), "tiny");
	total = V * D * 2 + 2 * D + 2 * D * D + 2 * KV * D + 3 * H * D + D;
	if (nl_model_alloc(m, total))
		abort();
	for (size_t i = 0; i < total; i++)
		m->arena[i] = (float)((i * 7919) % 201) / 100.0f - 1.0f;
	p = m->arena;
	m->weights.token_embedding = p; p += V * D;
	m->layers[0].attn_norm = p; p += D;
	m->layers[0].ffn_norm = p; p += D;
	m->layers[0].wq = p; p += D * D;
	m->layers[0].wk = p; p += KV * D;
	m->layers[0].wv = p; p += KV * D;
	m->layers[0].wo = p; p += D * D;
	m->layers[0].w_gate = p; p += H * D;
	m->layers[0].w_up = p; p += H * D;
	m->layers[0].w_down = p; p += D * H;
	m->weights.final_norm = p; p += D;
	m->weights.classifier = shared ? m->weights.token_embedding : p;
	return m;
}

static void put_floats(FILE *f, const float *x, size_t n)
{
	if (fwrite(x, sizeof(float), n, f) != n)
		abort();
}

static void put32(FILE *f, int32_t v)
{
	if (fwrite(&v, 4, 1, f) != 1)
		abort();
}

static void write_llama2c(const struct nl_model *m, const char *path, int version)
{
	const struct nl_model_config *c = &m->config;
	const struct nl_layer_weights *l = &m->layers[0];
	size_t D = DIM, H = HIDDEN, V = VOCAB, KV = DIM / 2;
	FILE *f = fopen(path, "wb");
	float zeros[SEQ * DIM / 4] = { 0 };

	if (!f)
		abort();
	if (version == 1) {
		uint8_t pad[256 - 36] = { (uint8_t)c->shared_classifier };

		put32(f, 0x616b3432);
		put32(f, 1);
		put32(f, DIM); put32(f, HIDDEN); put32(f, 1); put32(f, 4); put32(f, 2);
		put32(f, VOCAB); put32(f, SEQ);
		if (fwrite(pad, 1, sizeof(pad), f) != sizeof(pad))
			abort();
		put_floats(f, l->attn_norm, D);
		put_floats(f, l->ffn_norm, D);
		put_floats(f, m->weights.final_norm, D);
		put_floats(f, m->weights.token_embedding, V * D);
	} else {
		put32(f, DIM); put32(f, HIDDEN); put32(f, 1); put32(f, 4); put32(f, 2);
		put32(f, c->shared_classifier ? VOCAB : -VOCAB); put32(f, SEQ);
		put_floats(f, m->weights.token_embedding, V * D);
		put_floats(f, l->attn_norm, D);
	}
	put_floats(f, l->wq, D * D);
	put_floats(f, l->wk, KV * D);
	put_floats(f, l->wv, KV * D);
	put_floats(f, l->wo, D * D);
	if (version == 0)
		put_floats(f, l->ffn_norm, D);
	put_floats(f, l->w_gate, H * D);
	put_floats(f, l->w_down, D * H);
	put_floats(f, l->w_up, H * D);
	if (version == 0) {
		put_floats(f, m->weights.final_norm, D);
		/* freq_cis_real, freq_cis_imag: seq_len x head_size / 2 each */
		put_floats(f, zeros, SEQ * (DIM / 4) / 2);
		put_floats(f, zeros, SEQ * (DIM / 4) / 2);
	}
	if (!c->shared_classifier)
		put_floats(f, m->weights.classifier, V * D);
	if (fclose(f))
		abort();
}

static void write_tokenizer(const char *path)
{
	FILE *f = fopen(path, "wb");

	if (!f)
		abort();
	put32(f, 8);
	for (int i = 0; i < VOCAB; i++) {
		char piece[16];
		size_t len = 0;

		/* tokenizer.bin spells U+2581 as a plain space */
		for (const char *s = pieces[i]; *s;) {
			if (!strncmp(s, "\xe2\x96\x81", 3)) {
				piece[len++] = ' ';
				s += 3;
			} else {
				piece[len++] = *s++;
			}
		}
		if (fwrite(&scores[i], 4, 1, f) != 1)
			abort();
		put32(f, (int32_t)len);
		if (fwrite(piece, 1, len, f) != len)
			abort();
	}
	if (fclose(f))
		abort();
}

int main(int argc, char **argv)
{
	static const struct { const char *name; uint32_t type; bool shared; } ggufs[] = {
		{ "tiny-f32.gguf", NL_GGML_F32, true },
		{ "tiny-f16.gguf", NL_GGML_F16, true },
		{ "tiny-bf16.gguf", NL_GGML_BF16, true },
		{ "tiny-q8_0.gguf", NL_GGML_Q8_0, true },
		{ "tiny-unshared-f32.gguf", NL_GGML_F32, false },
	};
	char path[4096];

	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return 2;
	}
	for (size_t i = 0; i < sizeof(ggufs) / sizeof(ggufs[0]); i++) {
		struct nl_model *m = tiny_model(ggufs[i].shared);
		struct gw *g = gw_from_model(m, ggufs[i].type);

		gw_kv_str(g, "tokenizer.ggml.model", "llama");
		gw_kv_arr_str(g, "tokenizer.ggml.tokens", pieces, VOCAB);
		gw_kv_arr_f32(g, "tokenizer.ggml.scores", scores, VOCAB);
		gw_kv_arr_i32(g, "tokenizer.ggml.token_type", types, VOCAB);
		gw_kv_u32(g, "tokenizer.ggml.bos_token_id", 1);
		gw_kv_u32(g, "tokenizer.ggml.eos_token_id", 2);
		snprintf(path, sizeof(path), "%s/%s", argv[1], ggufs[i].name);
		if (gw_write(g, path))
			abort();
		gw_free(g);
		nl_model_free(m);
	}
	for (int version = 0; version < 2; version++)
		for (int shared = 0; shared < 2; shared++) {
			struct nl_model *m = tiny_model(shared);

			snprintf(path, sizeof(path), "%s/tiny-v%d-%s.bin", argv[1], version,
				 shared ? "shared" : "unshared");
			write_llama2c(m, path, version);
			nl_model_free(m);
		}
	snprintf(path, sizeof(path), "%s/tiny-tokenizer.bin", argv[1]);
	write_tokenizer(path);
	return 0;
}
