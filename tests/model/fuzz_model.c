/*
 * libFuzzer target for the untrusted-bytes parsers of formats/: the GGUF
 * reader (header, metadata, tensor table, llama model, embedded vocabulary),
 * the llama2.c checkpoint reader (v0 and v1 headers) and the llama2.c
 * tokenizer.bin reader, plus the BPE encoder on whatever vocabulary loads.
 * Every input goes through all of them. Accepted inputs must satisfy the
 * invariants checked below.
 *
 * Built as a fuzzer only with -Dfuzz=true and clang:
 *   CC=clang meson setup build-fuzz -Dfuzz=true && ninja -C build-fuzz tests/model/fuzz_model
 *   build-fuzz/tests/model/fuzz_model -max_len=65536 tests/model/corpus
 * tests/fuzz.sh model [SECONDS] runs it; tests/fuzz_replay_main.c turns it into an
 * ordinary test over tests/model/corpus/.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "nl_model_internal.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define CHECK(cond) do { if (!(cond)) __builtin_trap(); } while (0)

static void exercise_model(struct nl_model *m)
{
	const struct nl_model_config *c = nl_model_get_config(m);
	const struct nl_model_weights *w = nl_model_get_weights(m);
	volatile float sink = 0.0f;
	size_t D = c->dim, H = c->hidden_dim, KV = D / c->n_heads * c->n_kv_heads;

	CHECK(nl_model_check_config(c, "fuzz") == 0);
	/* touch the first and last element of every matrix: ASan checks the bounds */
	sink += w->token_embedding[0] + w->token_embedding[c->vocab_size * D - 1];
	sink += w->classifier[0] + w->classifier[c->vocab_size * D - 1];
	sink += w->final_norm[D - 1];
	for (uint32_t l = 0; l < c->n_layers; l++) {
		const struct nl_layer_weights *lw = &w->layers[l];

		sink += lw->attn_norm[D - 1] + lw->ffn_norm[D - 1];
		sink += lw->wq[D * D - 1] + lw->wo[D * D - 1];
		sink += lw->wk[KV * D - 1] + lw->wv[KV * D - 1];
		sink += lw->w_gate[H * D - 1] + lw->w_up[H * D - 1] + lw->w_down[D * H - 1];
	}
	(void)sink;
}

static void exercise_vocab(struct nl_vocab *v)
{
	static const char text[] = "Once upon a time, \xc3\xa9 \xf0\x9f\x98\x80 <s> \xff a b";
	uint32_t *ids;
	size_t n;

	CHECK(nl_vocab_bos(v) < nl_vocab_size(v) && nl_vocab_eos(v) < nl_vocab_size(v));
	if (nl_vocab_encode(v, text, sizeof(text) - 1, true, &ids, &n) == 0) {
		CHECK(n >= 1 && n <= sizeof(text) + 1);
		for (size_t i = 0; i < n; i++) {
			CHECK(ids[i] < nl_vocab_size(v));
			(void)nl_vocab_piece(v, ids[i]);
		}
		free(ids);
	}
}

/* The token count that makes a tokenizer.bin end exactly at the end of data, or 0. */
static uint32_t tokenizer_count(const uint8_t *data, size_t size)
{
	uint64_t pos = 4;
	uint32_t n = 0;

	while (pos + 8 <= size && n < (1u << 20)) {
		uint32_t len = nl_le32(data + pos + 4);

		pos += 8;
		if (len > size - pos)
			return 0;
		pos += len;
		n++;
		if (pos == size)
			return n;
	}
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct nl_model *m;
	struct nl_vocab *v;
	struct nl_gguf g;
	uint32_t count;

	if (nl_gguf_parse(&g, "fuzz.gguf", data, size) == 0) {
		for (uint64_t i = 0; i < g.n_tensors; i++) {
			const struct nl_gguf_tensor *t = &g.tensors[i];

			CHECK(t->data >= data && t->n_bytes <= size &&
			      (size_t)(t->data - data) <= size - t->n_bytes);
			CHECK(nl_gguf_find_tensor(&g, t->name) != NULL);
		}
		m = calloc(1, sizeof(*m));
		if (m && nl_gguf_load_model(m, &g) == 0)
			exercise_model(m);
		nl_model_free(m);
		if (nl_vocab_from_gguf(&v, &g) == 0) {
			exercise_vocab(v);
			nl_vocab_free(v);
		}
		nl_gguf_release(&g);
	}
	m = calloc(1, sizeof(*m));
	if (m && nl_llama2c_parse(m, "fuzz.bin", data, size) == 0)
		exercise_model(m);
	nl_model_free(m);
	count = tokenizer_count(data, size);
	if (count && nl_vocab_parse_llama2c(&v, "fuzz-tokenizer.bin", data, size, count) == 0) {
		CHECK(nl_vocab_size(v) == count);
		exercise_vocab(v);
		nl_vocab_free(v);
	}
	return 0;
}
