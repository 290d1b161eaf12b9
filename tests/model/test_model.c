/*
 * tests/model: checkpoint readers (llama2.c v0/v1, GGUF), the vocabularies and
 * BPE encoder, and the forward pass, against the reference figures of
 * ../shared/data/README.md and an independent run.c-style forward pass.
 */
#include <criterion/criterion.h>

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "gguf_writer.h"
#include "nl_forward_internal.h"
#include "nl_model_internal.h"
#include "nl_profile.h"
#include "ref_runc.h"

/* ---- fixtures ---- */

static char data_dir[1024];
static char tmp_dir[256];

static const char *data_path(const char *rel)
{
	static char buf[4][1400];
	static int next;
	char *p = buf[next++ % 4];

	snprintf(p, sizeof(buf[0]), "%s/%s", data_dir, rel);
	return p;
}

static const char *tmp_path(const char *name)
{
	static char buf[4][512];
	static int next;
	char *p = buf[next++ % 4];

	snprintf(p, sizeof(buf[0]), "%s/%s", tmp_dir, name);
	return p;
}

static void need_data(void)
{
	const char *d = getenv("NL_DATA_DIR");
	struct stat st;

	if (!d || !*d)
		d = "../shared/data";
	snprintf(data_dir, sizeof(data_dir), "%s", d);
	if (stat(data_path("models/stories260K/stories260K.bin"), &st) != 0)
		cr_skip_test("real data not found under NL_DATA_DIR='%s' "
			     "(models/stories260K/stories260K.bin); set NL_DATA_DIR", d);
}

static void make_tmp(void)
{
	snprintf(tmp_dir, sizeof(tmp_dir), "/tmp/nl-model-test-XXXXXX");
	cr_assert_not_null(mkdtemp(tmp_dir));
}

static void remove_tmp(void)
{
	char cmd[400];

	if (!tmp_dir[0])
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp_dir);
	cr_assert_eq(system(cmd), 0);
	tmp_dir[0] = '\0';
}

static void setup(void)
{
	tmp_dir[0] = '\0';
	need_data();
	make_tmp();
}

static void teardown(void)
{
	remove_tmp();
}

static struct nl_model *open_model(const char *path)
{
	struct nl_model *m = NULL;
	int err = nl_model_open(&m, path);

	cr_assert_eq(err, 0, "nl_model_open('%s') = %d: %s", path, err, nl_diag_msg());
	return m;
}

static struct nl_vocab *open_tok512(void)
{
	struct nl_vocab *v = NULL;
	int err = nl_vocab_open_llama2c(&v, data_path("models/stories260K/tok512.bin"), 512);

	cr_assert_eq(err, 0, "tok512.bin: %d %s", err, nl_diag_msg());
	return v;
}

static char *read_all(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long size;

	cr_assert_not_null(f, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)size + 1);
	cr_assert_not_null(buf);
	cr_assert_eq(fread(buf, 1, (size_t)size, f), (size_t)size);
	buf[size] = '\0';
	fclose(f);
	*len = (size_t)size;
	return buf;
}

static void write_all(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");

	cr_assert_not_null(f, "cannot create %s", path);
	cr_assert_eq(fwrite(data, 1, len, f), len);
	cr_assert_eq(fclose(f), 0);
}

static void put32(FILE *f, uint32_t v)
{
	uint8_t le[4] = { (uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24) };

	cr_assert_eq(fwrite(le, 1, 4, f), 4);
}

static void put_floats(FILE *f, const float *x, size_t n)
{
	cr_assert_eq(fwrite(x, sizeof(float), n, f), n);
}

/* Logits of a whole sequence ([n, vocab], caller frees). */
static float *run_logits(const struct nl_model *m, const uint32_t *ids, size_t n, uint32_t threads)
{
	const struct nl_model_config *c = nl_model_get_config(m);
	float *logits = malloc(n * c->vocab_size * sizeof(float));
	struct nl_forward *f;
	int err;

	cr_assert_not_null(logits);
	err = nl_forward_create(&f, m, NL_FFN_SWIGLU, threads);
	cr_assert_eq(err, 0, "%s", nl_diag_msg());
	err = nl_forward_sequence(f, ids, n, NULL, NULL, logits);
	cr_assert_eq(err, 0, "%s", nl_diag_msg());
	nl_forward_free(f);
	return logits;
}

/* The tokens of the first story of the TinyStories sample, BOS first. */
static uint32_t *first_story(const struct nl_vocab *v, size_t *n)
{
	size_t len;
	char *text = read_all(data_path("text/tinystories/tinystories_sample_cs336.txt"), &len);
	char *end = strstr(text, "<|endoftext|>");
	uint32_t *ids;

	cr_assert_not_null(end);
	while (end > text && isspace((unsigned char)end[-1]))
		end--;
	cr_assert_eq(nl_vocab_encode(v, text, (size_t)(end - text), true, &ids, n), 0);
	free(text);
	return ids;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
	double d = 0.0;

	for (size_t i = 0; i < n; i++)
		if (fabs((double)a[i] - b[i]) > d)
			d = fabs((double)a[i] - b[i]);
	return d;
}

TestSuite(model, .init = setup, .fini = teardown, .timeout = 120);

/* ---- reference NLL (data/README.md) ---- */

Test(model, llama2c_config)
{
	struct nl_model *m = open_model(data_path("models/stories260K/stories260K.bin"));
	const struct nl_model_config *c = nl_model_get_config(m);
	struct nl_model_id id;

	cr_expect_eq(c->dim, 64);
	cr_expect_eq(c->hidden_dim, 172);
	cr_expect_eq(c->n_layers, 5);
	cr_expect_eq(c->n_heads, 8);
	cr_expect_eq(c->n_kv_heads, 4);
	cr_expect_eq(c->vocab_size, 512);
	cr_expect_eq(c->seq_len, 512);
	cr_expect(c->shared_classifier);
	cr_expect_eq(c->source, NL_MODEL_LLAMA2C_V0);
	cr_expect_str_eq(c->name, "stories260K");
	nl_model_get_id(m, &id);
	cr_expect_str_eq(id.name, "stories260K");
	cr_expect_eq(id.n_layers, 5);
	cr_expect_eq(id.d_model, 64);
	cr_expect_eq(id.n_neurons, 172);
	cr_expect_eq(nl_model_get_weights(m)->classifier,
		     nl_model_get_weights(m)->token_embedding);
	nl_model_free(m);
}

Test(model, nll_reference_stories)
{
	static const struct { size_t tokens; double nll; } ref[] = {
		{ 373, 1.3160 }, { 329, 1.2386 }, { 222, 0.9522 }, { 424, 1.4934 }, { 456, 1.1879 },
	};
	struct nl_model *m = open_model(data_path("models/stories260K/stories260K.bin"));
	struct nl_vocab *v = open_tok512();
	size_t len, n_story = 0, total_tokens = 0;
	char *text = read_all(data_path("text/tinystories/tinystories_sample_cs336.txt"), &len);
	char *s = text;
	double total = 0.0;

	for (;;) {
		char *e = strstr(s, "<|endoftext|>");
		char *a = s, *b = e ? e : s + strlen(s);

		while (a < b && isspace((unsigned char)*a))
			a++;
		while (b > a && isspace((unsigned char)b[-1]))
			b--;
		if (b > a) {
			uint32_t *ids;
			size_t n;
			float *logits;
			double nll;

			cr_assert_eq(nl_vocab_encode(v, a, (size_t)(b - a), true, &ids, &n), 0);
			cr_assert_lt(n_story, 5, "more than 5 stories in the sample");
			cr_assert_eq(ids[0], 1);
			logits = run_logits(m, ids, n, 1);
			nll = nl_forward_nll_sum(logits, ids, n, 512);
			cr_expect_eq(n - 1, ref[n_story].tokens, "story %zu: %zu tokens, expected %zu",
				     n_story, n - 1, ref[n_story].tokens);
			cr_expect(fabs(nll / (double)(n - 1) - ref[n_story].nll) < 5e-5,
				  "story %zu: NLL %.5f, expected %.4f", n_story,
				  nll / (double)(n - 1), ref[n_story].nll);
			total += nll;
			total_tokens += n - 1;
			n_story++;
			free(logits);
			free(ids);
		}
		if (!e)
			break;
		s = e + strlen("<|endoftext|>");
	}
	cr_expect_eq(n_story, 5);
	cr_expect_eq(total_tokens, 1804);
	cr_expect(fabs(total / (double)total_tokens - 1.2664) < 5e-5, "mean NLL %.5f, expected 1.2664",
		  total / (double)total_tokens);
	free(text);
	nl_vocab_free(v);
	nl_model_free(m);
}

Test(model, nll_first_2000_chars)
{
	struct nl_model *m = open_model(data_path("models/stories260K/stories260K.bin"));
	struct nl_vocab *v = open_tok512();
	size_t len, n;
	char *text = read_all(data_path("text/tinystories/tinystories_sample_cs336.txt"), &len);
	uint32_t *ids;
	float *logits;
	double nll;

	cr_assert_gt(len, 2000);
	cr_assert_eq(nl_vocab_encode(v, text, 2000, true, &ids, &n), 0);
	cr_assert_gt(n, 101);
	logits = run_logits(m, ids, 101, 1);
	nll = nl_forward_nll_sum(logits, ids, 101, 512) / 100.0;
	cr_expect(fabs(nll - 1.1644) < 5e-5, "NLL %.5f, expected 1.1644", nll);
	free(logits);
	free(ids);
	free(text);
	nl_vocab_free(v);
	nl_model_free(m);
}

/* A second real llama2.c model: 4 heads without GQA, head size 16, context 128. */
Test(model, aidreams_against_runc)
{
	struct nl_model *m = open_model(data_path("models/aidreams260K/aidreams260K.bin"));
	const struct nl_model_config *c = nl_model_get_config(m);
	struct nl_vocab *v = NULL;
	struct nl_ref *ref;
	uint32_t *ids;
	size_t n;
	float *logits, row[512];
	double worst = 0.0, nll;
	const char *text = "Once upon a time, there was a little robot who wanted to dream.";
	int err;

	cr_expect_eq(c->dim, 64);
	cr_expect_eq(c->hidden_dim, 172);
	cr_expect_eq(c->n_layers, 4);
	cr_expect_eq(c->n_heads, 4);
	cr_expect_eq(c->n_kv_heads, 4);
	cr_expect_eq(c->seq_len, 128);
	err = nl_vocab_open_llama2c(&v, data_path("models/aidreams260K/tok512_aidreams.bin"),
				    c->vocab_size);
	cr_assert_eq(err, 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_vocab_encode(v, text, strlen(text), true, &ids, &n), 0);
	cr_assert_gt(n, 5);
	logits = run_logits(m, ids, n, 2);
	ref = nl_ref_create(m, false);
	for (size_t t = 0; t < n; t++) {
		double d;

		nl_ref_step(ref, ids[t], (uint32_t)t, row, NULL);
		d = max_abs_diff(row, logits + t * c->vocab_size, c->vocab_size);
		worst = d > worst ? d : worst;
	}
	cr_expect_lt(worst, 1e-3, "max logit difference to the run.c-style pass: %g", worst);
	nll = nl_forward_nll_sum(logits, ids, n, c->vocab_size) / (double)(n - 1);
	cr_expect(nll > 0.0 && nll < log(512.0), "NLL %.4f is not better than uniform", nll);
	nl_ref_free(ref);
	free(logits);
	free(ids);
	nl_vocab_free(v);
	nl_model_free(m);
}

/* ---- GGUF and llama2.c agree ---- */

Test(model, gguf_f32_identical)
{
	struct nl_model *a = open_model(data_path("models/stories260K/stories260K.bin"));
	struct nl_model *b = open_model(data_path("models/stories260K/stories260K-f32.gguf"));
	const struct nl_model_config *ca = nl_model_get_config(a), *cb = nl_model_get_config(b);
	struct nl_vocab *v = open_tok512();
	uint32_t *ids;
	size_t n;
	float *la, *lb;

	cr_expect_eq(cb->source, NL_MODEL_GGUF);
	cr_expect_eq(ca->dim, cb->dim);
	cr_expect_eq(ca->hidden_dim, cb->hidden_dim);
	cr_expect_eq(ca->n_layers, cb->n_layers);
	cr_expect_eq(ca->n_heads, cb->n_heads);
	cr_expect_eq(ca->n_kv_heads, cb->n_kv_heads);
	cr_expect_eq(ca->vocab_size, cb->vocab_size);
	cr_expect_eq(ca->seq_len, cb->seq_len);
	cr_expect_eq(ca->rms_eps, cb->rms_eps);
	cr_expect_eq(ca->rope_theta, cb->rope_theta);
	cr_expect(cb->shared_classifier);
	cr_expect_str_eq(cb->name, "stories260K");
	ids = first_story(v, &n);
	la = run_logits(a, ids, n, 1);
	lb = run_logits(b, ids, n, 1);
	cr_expect(memcmp(la, lb, n * 512 * sizeof(float)) == 0,
		  "GGUF F32 logits differ from llama2.c (max %g)", max_abs_diff(la, lb, n * 512));
	free(la);
	free(lb);
	free(ids);
	nl_vocab_free(v);
	nl_model_free(a);
	nl_model_free(b);
}

Test(model, gguf_f16_within_tolerance)
{
	struct nl_model *a = open_model(data_path("models/stories260K/stories260K.bin"));
	struct nl_model *b = open_model(data_path("models/stories260K/stories260K-f16.gguf"));
	const struct nl_model_weights *wa = nl_model_get_weights(a), *wb = nl_model_get_weights(b);
	struct nl_vocab *v = open_tok512();
	uint32_t *ids;
	size_t n;
	float *la, *lb;
	double nla, nlb;

	/* every F16 weight is the F32 one rounded to half precision */
	for (size_t i = 0; i < 64 * 64; i++)
		cr_assert_eq(wb->layers[2].wq[i], nl_f16_to_f32(nl_f32_to_f16(wa->layers[2].wq[i])),
			     "blk.2.attn_q[%zu]", i);
	ids = first_story(v, &n);
	la = run_logits(a, ids, n, 1);
	lb = run_logits(b, ids, n, 1);
	nla = nl_forward_nll_sum(la, ids, n, 512) / (double)(n - 1);
	nlb = nl_forward_nll_sum(lb, ids, n, 512) / (double)(n - 1);
	cr_expect_lt(max_abs_diff(la, lb, n * 512), 0.05, "max logit difference %g",
		     max_abs_diff(la, lb, n * 512));
	cr_expect_lt(fabs(nla - nlb), 2e-3, "NLL F32 %.5f vs F16 %.5f", nla, nlb);
	free(la);
	free(lb);
	free(ids);
	nl_vocab_free(v);
	nl_model_free(a);
	nl_model_free(b);
}

/* Writes the v0 weights of m as a llama2.c file (v0 or v1; shared or not). */
static void write_llama2c(const struct nl_model *m, const char *path, int version, bool shared)
{
	const struct nl_model_config *c = nl_model_get_config(m);
	const struct nl_model_weights *w = nl_model_get_weights(m);
	size_t D = c->dim, H = c->hidden_dim, V = c->vocab_size;
	size_t KV = D / c->n_heads * c->n_kv_heads, hs = D / c->n_heads;
	FILE *f = fopen(path, "wb");
	int32_t hdr[7] = { (int32_t)D, (int32_t)H, (int32_t)c->n_layers, (int32_t)c->n_heads,
			   (int32_t)c->n_kv_heads, (int32_t)V, (int32_t)c->seq_len };

	cr_assert_not_null(f);
	if (version == 1) {
		uint8_t pad[256 - 37] = { 0 };
		uint8_t flag = shared;

		put32(f, 0x616b3432);
		put32(f, 1);
		for (int i = 0; i < 7; i++)
			put32(f, (uint32_t)hdr[i]);
		cr_assert_eq(fwrite(&flag, 1, 1, f), 1);
		cr_assert_eq(fwrite(pad, 1, sizeof(pad), f), sizeof(pad));
		for (uint32_t l = 0; l < c->n_layers; l++)
			put_floats(f, w->layers[l].attn_norm, D);
		for (uint32_t l = 0; l < c->n_layers; l++)
			put_floats(f, w->layers[l].ffn_norm, D);
		put_floats(f, w->final_norm, D);
		put_floats(f, w->token_embedding, V * D);
	} else {
		if (!shared)
			hdr[5] = -hdr[5];
		for (int i = 0; i < 7; i++)
			put32(f, (uint32_t)hdr[i]);
		put_floats(f, w->token_embedding, V * D);
		for (uint32_t l = 0; l < c->n_layers; l++)
			put_floats(f, w->layers[l].attn_norm, D);
	}
#define ALL(field, count) \
	for (uint32_t l = 0; l < c->n_layers; l++) \
		put_floats(f, w->layers[l].field, (count))
	ALL(wq, D * D);
	ALL(wk, KV * D);
	ALL(wv, KV * D);
	ALL(wo, D * D);
	if (version == 0)
		ALL(ffn_norm, D);
	ALL(w_gate, H * D);
	ALL(w_down, D * H);
	ALL(w_up, H * D);
#undef ALL
	if (version == 0) {
		float *rope = calloc(c->seq_len * hs, sizeof(float));

		put_floats(f, w->final_norm, D);
		put_floats(f, rope, c->seq_len * hs);  /* freq_cis_real + imag */
		free(rope);
	}
	if (!shared)
		put_floats(f, w->classifier, V * D);
	cr_assert_eq(fclose(f), 0);
}

Test(model, llama2c_v1_and_unshared_identical)
{
	struct nl_model *a = open_model(data_path("models/stories260K/stories260K.bin"));
	struct nl_vocab *v = open_tok512();
	static const struct { int version; bool shared; enum nl_model_source src; } cases[] = {
		{ 1, true, NL_MODEL_LLAMA2C_V1 },
		{ 1, false, NL_MODEL_LLAMA2C_V1 },
		{ 0, false, NL_MODEL_LLAMA2C_V0 },
	};
	uint32_t *ids;
	size_t n;
	float *la;

	ids = first_story(v, &n);
	la = run_logits(a, ids, n, 1);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const char *path = tmp_path("copy.bin");
		struct nl_model *b;
		float *lb;

		write_llama2c(a, path, cases[i].version, cases[i].shared);
		b = open_model(path);
		cr_expect_eq(nl_model_get_config(b)->source, cases[i].src);
		cr_expect_eq(nl_model_get_config(b)->shared_classifier, cases[i].shared);
		cr_expect_str_eq(nl_model_get_config(b)->name, "copy");
		lb = run_logits(b, ids, n, 1);
		cr_expect(memcmp(la, lb, n * 512 * sizeof(float)) == 0,
			  "v%d %s: logits differ (max %g)", cases[i].version,
			  cases[i].shared ? "shared" : "unshared", max_abs_diff(la, lb, n * 512));
		free(lb);
		nl_model_free(b);
	}
	free(la);
	free(ids);
	nl_vocab_free(v);
	nl_model_free(a);
}

Test(model, gguf_written_f32_bf16_q8_0)
{
	struct nl_model *a = open_model(data_path("models/stories260K/stories260K.bin"));
	const struct nl_model_weights *wa = nl_model_get_weights(a);
	struct nl_vocab *v = open_tok512();
	uint32_t *ids;
	size_t n;
	float *la;
	double nla;

	ids = first_story(v, &n);
	la = run_logits(a, ids, n, 1);
	nla = nl_forward_nll_sum(la, ids, n, 512) / (double)(n - 1);
	for (int k = 0; k < 3; k++) {
		static const uint32_t types[] = { NL_GGML_F32, NL_GGML_BF16, NL_GGML_Q8_0 };
		struct gw *g = gw_from_model(a, types[k]);
		const struct nl_model_weights *wb;
		struct nl_model *b;
		float *lb;
		double nlb;

		cr_assert_eq(gw_write(g, tmp_path("w.gguf")), 0);
		gw_free(g);
		b = open_model(tmp_path("w.gguf"));
		wb = nl_model_get_weights(b);
		/* the dequantised weights are exactly what ggml's encodings give back */
		for (size_t i = 0; i < 64 * 172; i++) {
			float x = wa->layers[3].w_up[i], want = x;

			if (types[k] == NL_GGML_BF16) {
				want = nl_bf16_to_f32(gw_f32_to_bf16(x));
			} else if (types[k] == NL_GGML_Q8_0) {
				uint8_t blk[34];

				gw_quantize_q8_0(&wa->layers[3].w_up[i / 32 * 32], 32, blk);
				want = nl_f16_to_f32(nl_le16(blk)) * (float)(int8_t)blk[2 + i % 32];
			}
			cr_assert_eq(wb->layers[3].w_up[i], want, "type %u, blk.3.ffn_up[%zu]: %g, "
				     "expected %g", types[k], i, wb->layers[3].w_up[i], want);
		}
		lb = run_logits(b, ids, n, 1);
		nlb = nl_forward_nll_sum(lb, ids, n, 512) / (double)(n - 1);
		if (types[k] == NL_GGML_F32)
			cr_expect(memcmp(la, lb, n * 512 * sizeof(float)) == 0);
		else
			cr_expect_lt(fabs(nla - nlb), types[k] == NL_GGML_Q8_0 ? 0.01 : 0.03,
				     "type %u: NLL %.5f vs F32 %.5f", types[k], nlb, nla);
		free(lb);
		nl_model_free(b);
	}
	free(la);
	free(ids);
	nl_vocab_free(v);
	nl_model_free(a);
}

Test(model, half_conversions, .init = NULL)
{
	static const struct { uint16_t h; float f; } f16[] = {
		{ 0x3c00, 1.0f }, { 0xc000, -2.0f }, { 0x7bff, 65504.0f }, { 0x0001, 5.960464477539063e-08f },
		{ 0x0400, 6.103515625e-05f }, { 0x3555, 0.333251953125f }, { 0x0000, 0.0f },
		{ 0x8000, -0.0f },
	};

	for (size_t i = 0; i < sizeof(f16) / sizeof(f16[0]); i++) {
		cr_expect_eq(nl_f16_to_f32(f16[i].h), f16[i].f, "f16 0x%04x", f16[i].h);
		cr_expect_eq(nl_f32_to_f16(f16[i].f), f16[i].h, "to f16 %g", f16[i].f);
	}
	cr_expect(isinf(nl_f16_to_f32(0x7c00)));
	cr_expect(isnan(nl_f16_to_f32(0x7e00)));
	cr_expect_eq(nl_f32_to_f16(1e6f), 0x7c00);  /* overflow to inf */
	/* the half ulp at 1.0 is 4/4096: ties go to the even neighbour */
	cr_expect_eq(nl_f32_to_f16(1.0f + 1.0f / 4096), 0x3c00);
	cr_expect_eq(nl_f32_to_f16(1.0f + 3.0f / 4096), 0x3c01);
	cr_expect_eq(nl_f32_to_f16(1.0f + 2.0f / 4096), 0x3c00);
	cr_expect_eq(nl_f32_to_f16(1.0f + 6.0f / 4096), 0x3c02);
	/* every half round-trips */
	for (uint32_t h = 0; h < 0x10000; h++) {
		float f = nl_f16_to_f32((uint16_t)h);

		if (!isnan(f))
			cr_assert_eq(nl_f32_to_f16(f), h, "half 0x%04x", h);
	}
	cr_expect_eq(nl_bf16_to_f32(0x3f80), 1.0f);
	cr_expect_eq(nl_bf16_to_f32(0xc0a0), -5.0f);
	cr_expect_eq(gw_f32_to_bf16(1.00390625f), 0x3f80);  /* tie to even */
}

/* ---- tokenizer ---- */

static void expect_ids(const struct nl_vocab *v, const char *text, const uint32_t *want,
		       size_t n_want)
{
	uint32_t *ids;
	size_t n;

	cr_assert_eq(nl_vocab_encode(v, text, strlen(text), false, &ids, &n), 0);
	cr_expect_eq(n, n_want, "'%s': %zu tokens, expected %zu", text, n, n_want);
	for (size_t i = 0; i < n && i < n_want; i++)
		cr_expect_eq(ids[i], want[i], "'%s': token %zu is %u ('%s'), expected %u ('%s')",
			     text, i, ids[i], nl_vocab_piece(v, ids[i]), want[i],
			     nl_vocab_piece(v, want[i]));
	free(ids);
}

/* Concatenated pieces (byte tokens as their byte) must give back " " + text. */
static void expect_roundtrip(const struct nl_vocab *v, const char *text, size_t len)
{
	uint32_t *ids;
	size_t n, pos = 0;
	char *back = malloc(len + 2);

	cr_assert_eq(nl_vocab_encode(v, text, len, false, &ids, &n), 0);
	for (size_t i = 0; i < n; i++) {
		const char *p = nl_vocab_piece(v, ids[i]);
		unsigned int byte;

		if (strlen(p) == 6 && sscanf(p, "<0x%02X>", &byte) == 1) {
			back[pos++] = (char)byte;
			continue;
		}
		cr_assert_leq(pos + strlen(p), len + 1);
		memcpy(back + pos, p, strlen(p));
		pos += strlen(p);
	}
	cr_expect_eq(pos, len + (len > 0));
	cr_expect(len == 0 || (back[0] == ' ' && memcmp(back + 1, text, len) == 0));
	free(back);
	free(ids);
}

Test(model, tokenizer_hand_checked)
{
	struct nl_vocab *v = open_tok512();
	/* pieces checked by hand against tok512.bin: " Once", " upon", " a", " time" */
	const uint32_t once_upon[] = { 403, 407, 261, 378 };
	/* " " (410), then the newline through byte fallback: 0x0A + 3 */
	const uint32_t newline[] = { 410, 13 };
	/* " Lily" " was" " happy" "." */
	const uint32_t lily[] = { 317, 286, 393, 426 };
	/* " S" "ue" -> no " Sue" token: " S" (301) "u" (425) "e" (411) */
	const uint32_t sue[] = { 301, 425, 411 };

	cr_expect_eq(nl_vocab_size(v), 512);
	cr_expect_eq(nl_vocab_bos(v), 1);
	cr_expect_eq(nl_vocab_eos(v), 2);
	cr_expect_str_eq(nl_vocab_piece(v, 403), " Once");
	cr_expect_str_eq(nl_vocab_piece(v, 407), " upon");
	cr_expect_str_eq(nl_vocab_piece(v, 261), " a");
	cr_expect_str_eq(nl_vocab_piece(v, 378), " time");
	cr_expect_str_eq(nl_vocab_piece(v, 13), "<0x0A>");
	cr_expect_str_eq(nl_vocab_piece(v, 410), " ");
	expect_ids(v, "Once upon a time", once_upon, 4);
	expect_ids(v, "\n", newline, 2);
	expect_ids(v, "Lily was happy.", lily, 4);
	expect_ids(v, "Sue", sue, 3);
	expect_roundtrip(v, "Once upon a time, there was a little girl named Lily.", 53);
	nl_vocab_free(v);
}

Test(model, tokenizer_byte_fallback_unicode_empty)
{
	struct nl_vocab *v = open_tok512();
	/* é is a token (485); ü is not: its UTF-8 bytes 0xC3 0xBC fall back to <0xC3> <0xBC> */
	const uint32_t e_acute[] = { 410, 485 };
	const uint32_t u_uml[] = { 410, 0xc3 + 3, 0xbc + 3 };
	/* a 4-byte emoji: four byte tokens */
	const uint32_t emoji[] = { 410, 0xf0 + 3, 0x9f + 3, 0x98 + 3, 0x80 + 3 };
	const char *texts[] = { "naïve café — 日本語 😀 <s> <0x0A> \t\r\n end",
				"\xff\xfe broken \xc3",
				"a\0b" };
	uint32_t *ids;
	size_t n;

	expect_ids(v, "\xc3\xa9", e_acute, 2);
	expect_ids(v, "\xc3\xbc", u_uml, 3);
	expect_ids(v, "\xf0\x9f\x98\x80", emoji, 5);
	for (size_t i = 0; i < 2; i++)
		expect_roundtrip(v, texts[i], strlen(texts[i]));
	expect_roundtrip(v, texts[2], 3);  /* an embedded NUL is a byte like any other */
	/* "<s>" in the text is text, never BOS */
	cr_assert_eq(nl_vocab_encode(v, "<s>", 3, false, &ids, &n), 0);
	for (size_t i = 0; i < n; i++)
		cr_expect_neq(ids[i], 1);
	free(ids);
	cr_assert_eq(nl_vocab_encode(v, "", 0, true, &ids, &n), 0);
	cr_expect_eq(n, 1);
	cr_expect_eq(ids[0], 1);
	free(ids);
	cr_assert_eq(nl_vocab_encode(v, "", 0, false, &ids, &n), 0);
	cr_expect_eq(n, 0);
	free(ids);
	nl_vocab_free(v);
}

/*
 * llama2.c's encode() transcribed (linear lookups, full rescan per merge),
 * used as the independent reference for the heap-based encoder.
 */
static size_t naive_encode(const struct nl_vocab *v, const char *text, uint32_t *out)
{
	uint32_t n_vocab = nl_vocab_size(v);
	size_t n = 0, len = strlen(text);
	char buf[64];

	/* lookup that sees what the encoder may see: normal tokens */
#define LOOKUP(s, slen, res) do {                                                 \
		(res) = -1;                                                        \
		for (uint32_t id_ = 3; id_ < n_vocab; id_++) {                     \
			const char *p_ = nl_vocab_piece(v, id_);                    \
			if (strlen(p_) == (slen) && memcmp(p_, (s), (slen)) == 0 &&  \
			    !(strlen(p_) == 6 && p_[0] == '<' && p_[1] == '0')) { \
				(res) = (int)id_;                                  \
				break;                                             \
			}                                                          \
		}                                                                  \
	} while (0)
	if (len) {
		int id;

		LOOKUP(" ", (size_t)1, id);
		out[n++] = (uint32_t)id;
	}
	for (size_t i = 0; i < len;) {
		size_t cl = 1;
		int id;

		while (i + cl < len && cl < 4 && ((uint8_t)text[i + cl] & 0xc0) == 0x80)
			cl++;
		LOOKUP(text + i, cl, id);
		if (id >= 0) {
			out[n++] = (uint32_t)id;
		} else {
			for (size_t b = 0; b < cl; b++)
				out[n++] = (uint8_t)text[i + b] + 3u;
		}
		i += cl;
	}
	for (;;) {
		float best = -1e10f;
		int best_id = -1;
		size_t best_i = 0;

		for (size_t i = 0; i + 1 < n; i++) {
			int id;
			int k = snprintf(buf, sizeof(buf), "%s%s", nl_vocab_piece(v, out[i]),
					 nl_vocab_piece(v, out[i + 1]));

			if (k < 0 || (size_t)k >= sizeof(buf))
				continue;
			LOOKUP(buf, (size_t)k, id);
			if (id >= 0 && nl_vocab_score(v, (uint32_t)id) > best) {
				best = nl_vocab_score(v, (uint32_t)id);
				best_id = id;
				best_i = i;
			}
		}
		if (best_id < 0)
			break;
		out[best_i] = (uint32_t)best_id;
		memmove(out + best_i + 1, out + best_i + 2, (n - best_i - 2) * sizeof(*out));
		n--;
	}
#undef LOOKUP
	return n;
}

Test(model, tokenizer_matches_naive_llama2c)
{
	struct nl_vocab *v = open_tok512();
	size_t len, wlen;
	char *text = read_all(data_path("text/tinystories/tinystories_sample_cs336.txt"), &len);
	char *wiki = read_all(data_path("text/wikitext2/wiki.test.raw"), &wlen);
	const char *extra[] = { "naïve café — 日本語 😀", "aaaaaaaaaaaaaaaaaaaaaaaa",
				"   spaces   and\ttabs ",
				"The the THE tHe", "!!!???...,,,;;;" };
	char chunk[161];

	for (int k = 0; k < 12; k++) {
		const char *src = k < 6 ? text : wiki;
		size_t srclen = k < 6 ? len : wlen;
		size_t off = (srclen - 200) / 6 * (size_t)(k % 6);
		uint32_t *ids, naive[400];
		size_t n, nn;

		memcpy(chunk, src + off, 160);
		chunk[160] = '\0';
		for (size_t i = 0; i < 160; i++)
			if (!chunk[i])
				chunk[i] = ' ';
		if (k < (int)(sizeof(extra) / sizeof(extra[0])))
			snprintf(chunk + 100, 61, "%s", extra[k]);
		cr_assert_eq(nl_vocab_encode(v, chunk, strlen(chunk), false, &ids, &n), 0);
		nn = naive_encode(v, chunk, naive);
		cr_expect_eq(n, nn, "chunk %d: %zu tokens, naive llama2.c %zu", k, n, nn);
		for (size_t i = 0; i < n && i < nn; i++)
			cr_expect_eq(ids[i], naive[i], "chunk %d token %zu: %u vs naive %u", k, i,
				     ids[i], naive[i]);
		free(ids);
	}
	free(text);
	free(wiki);
	nl_vocab_free(v);
}

/* A tokenizer.bin of unk, bos, eos, 256 byte tokens and the given pieces. */
static void write_tokenizer(const char *path, const char *const *pieces, const float *scores,
			    size_t n)
{
	FILE *f = fopen(path, "wb");
	const char *special[3] = { "<unk>", "\n<s>\n", "\n</s>\n" };
	char byte[8];

	cr_assert_not_null(f);
	put32(f, 16);
	for (size_t i = 0; i < 259 + n; i++) {
		const char *p = i < 3 ? special[i] : i < 259 ? byte : pieces[i - 259];
		float score = i < 259 ? 0.0f : scores[i - 259];

		if (i >= 3 && i < 259)
			snprintf(byte, sizeof(byte), "<0x%02X>", (unsigned int)(i - 3));
		cr_assert_eq(fwrite(&score, 4, 1, f), 1);
		put32(f, (uint32_t)strlen(p));
		cr_assert_eq(fwrite(p, 1, strlen(p), f), strlen(p));
	}
	cr_assert_eq(fclose(f), 0);
}

Test(model, tokenizer_custom_vocab_matches_naive)
{
	/* ties on purpose (leftmost wins), and pieces with inner spaces in the first round */
	const char *pieces[] = { " ", "a", "b", "c", " a", "ab", "bc", "abc", " ab", "aa", "aaa",
				 "a b", " a b", "b c", "c c c" };
	const float scores[] = { -9, -9, -9, -9, -1, -2, -2, -3, -1, -2, -1, -4, -1, -2, 0 };
	uint64_t rng = 12345;

	for (int round = 0; round < 2; round++) {
		size_t n_pieces = round == 0 ? 15 : 11;  /* round 1: no inner spaces */
		struct nl_vocab *v = NULL;
		int err;

		write_tokenizer(tmp_path("custom.bin"), pieces, scores, n_pieces);
		err = nl_vocab_open_llama2c(&v, tmp_path("custom.bin"), 259 + (uint32_t)n_pieces);
		cr_assert_eq(err, 0, "%s", nl_diag_msg());
		for (int trial = 0; trial < 300; trial++) {
			static const char alphabet[] = "aabbc  d\n";
			char text[48];
			size_t len = 1 + (size_t)(trial % 40);
			uint32_t *ids, naive[128];
			size_t n, nn;

			for (size_t i = 0; i < len; i++) {
				rng = rng * 6364136223846793005ull + 1442695040888963407ull;
				text[i] = alphabet[(rng >> 33) % (sizeof(alphabet) - 1)];
			}
			text[len] = '\0';
			cr_assert_eq(nl_vocab_encode(v, text, len, false, &ids, &n), 0);
			nn = naive_encode(v, text, naive);
			cr_assert_eq(n, nn, "round %d '%s': %zu tokens, naive %zu", round, text, n, nn);
			for (size_t i = 0; i < n; i++)
				cr_assert_eq(ids[i], naive[i], "round %d '%s' token %zu: %u ('%s') vs "
					     "naive %u ('%s')", round, text, i, ids[i],
					     nl_vocab_piece(v, ids[i]), naive[i],
					     nl_vocab_piece(v, naive[i]));
			free(ids);
		}
		nl_vocab_free(v);
	}
}

Test(model, tokenizer_gguf_vocab_identical)
{
	struct nl_vocab *a = open_tok512(), *b = NULL;
	size_t len;
	char *text = read_all(data_path("text/tinystories/tinystories_sample_cs336.txt"), &len);
	uint32_t *ia, *ib;
	size_t na, nb;
	int err = nl_vocab_open_gguf(&b, data_path("models/stories260K/stories260K-f32.gguf"));

	cr_assert_eq(err, 0, "%s", nl_diag_msg());
	cr_expect_eq(nl_vocab_size(b), 512);
	cr_expect_eq(nl_vocab_bos(b), 1);
	cr_expect_eq(nl_vocab_eos(b), 2);
	cr_expect_str_eq(nl_vocab_piece(b, 403), " Once");  /* U+2581 shown as a space */
	cr_expect_str_eq(nl_vocab_piece(b, 1), "<s>");
	cr_expect_str_eq(nl_vocab_piece(a, 1), "\n<s>\n");
	/* the whole file as one string, BOS first */
	cr_assert_eq(nl_vocab_encode(a, text, len, true, &ia, &na), 0);
	cr_assert_eq(nl_vocab_encode(b, text, len, true, &ib, &nb), 0);
	cr_expect_eq(na, nb);
	cr_expect(na == nb && memcmp(ia, ib, na * sizeof(*ia)) == 0,
		  "tokenizer.bin and GGUF vocab encode differently");
	for (uint32_t id = 0; id < 512; id++)
		cr_expect_eq(nl_vocab_score(a, id), nl_vocab_score(b, id), "score of %u", id);
	free(ia);
	free(ib);
	free(text);
	nl_vocab_free(a);
	nl_vocab_free(b);
}

Test(model, tokenizer_long_text)
{
	struct nl_vocab *v = open_tok512();
	size_t len, n;
	char *text = read_all(data_path("text/wikitext2/wiki.test.raw"), &len);
	uint32_t *ids;

	/* 1.3 MB in one call: a quadratic encoder would not finish within the timeout */
	cr_assert_eq(nl_vocab_encode(v, text, len, true, &ids, &n), 0);
	cr_expect_gt(n, len / 8);
	cr_expect_lt(n, len + 2);
	for (size_t i = 0; i < n; i++)
		cr_assert_lt(ids[i], 512);
	free(ids);
	free(text);
	nl_vocab_free(v);
}

/* ---- forward pass ---- */

Test(model, forward_matches_runc_reference)
{
	struct nl_model *m = open_model(data_path("models/stories260K/stories260K.bin"));
	struct nl_vocab *v = open_tok512();
	struct nl_ref *ref = nl_ref_create(m, false);
	uint32_t *ids;
	size_t n;
	float *logits, row[512];
	double worst = 0.0;

	cr_assert_not_null(ref);
	ids = first_story(v, &n);
	logits = run_logits(m, ids, n, 1);
	for (size_t t = 0; t < n; t++) {
		double d;

		nl_ref_step(ref, ids[t], (uint32_t)t, row, NULL);
		d = max_abs_diff(row, logits + t * 512, 512);
		if (d > worst)
			worst = d;
	}
	cr_expect_lt(worst, 1e-3, "max logit difference to the run.c-style pass: %g", worst);
	nl_ref_free(ref);
	free(logits);
	free(ids);
	nl_vocab_free(v);
	nl_model_free(m);
}

Test(model, forward_threads_and_blocks_identical)
{
	struct nl_model *m = open_model(data_path("models/stories260K/stories260K.bin"));
	struct nl_vocab *v = open_tok512();
	struct nl_forward *f;
	uint32_t *ids;
	size_t n;
	float *one, *two, *blocks;

	ids = first_story(v, &n);
	one = run_logits(m, ids, n, 1);
	two = run_logits(m, ids, n, 2);
	cr_expect(memcmp(one, two, n * 512 * sizeof(float)) == 0,
		  "2 threads differ from 1 (max %g)", max_abs_diff(one, two, n * 512));
	blocks = malloc(n * 512 * sizeof(float));
	cr_assert_eq(nl_forward_create(&f, m, NL_FFN_SWIGLU, 2), 0);
	cr_assert_eq(nl_forward_set_block(f, 7), 0);
	cr_assert_eq(nl_forward_sequence(f, ids, n, NULL, NULL, blocks), 0);
	cr_expect(memcmp(one, blocks, n * 512 * sizeof(float)) == 0,
		  "blocks of 7 tokens differ (max %g)", max_abs_diff(one, blocks, n * 512));
	/* the state is reused: a second, shorter sequence starts afresh */
	cr_assert_eq(nl_forward_sequence(f, ids, 50, NULL, NULL, blocks), 0);
	cr_expect(memcmp(one, blocks, 50 * 512 * sizeof(float)) == 0);
	nl_forward_free(f);
	free(one);
	free(two);
	free(blocks);
	free(ids);
	nl_vocab_free(v);
	nl_model_free(m);
}

struct par_arg {
	const struct nl_model *m;
	const uint32_t *ids;
	size_t n;
	float *logits;
	int err;
};

static void *par_main(void *p)
{
	struct par_arg *a = p;
	struct nl_forward *f;

	a->err = nl_forward_create(&f, a->m, NL_FFN_SWIGLU, 1);
	for (int rep = 0; rep < 3 && !a->err; rep++)
		a->err = nl_forward_sequence(f, a->ids, a->n, NULL, NULL, a->logits);
	nl_forward_free(f);
	return NULL;
}

Test(model, forward_instances_in_parallel)
{
	struct nl_model *m = open_model(data_path("models/stories260K/stories260K.bin"));
	struct nl_vocab *v = open_tok512();
	struct par_arg args[2];
	pthread_t th[2];
	uint32_t *ids;
	size_t n;
	float *want[2];

	ids = first_story(v, &n);
	want[0] = run_logits(m, ids, n, 1);
	want[1] = run_logits(m, ids + 10, n - 10, 1);
	for (int i = 0; i < 2; i++) {
		args[i] = (struct par_arg){ m, ids + 10 * i, n - 10 * (size_t)i, NULL, 0 };
		args[i].logits = malloc(n * 512 * sizeof(float));
		cr_assert_eq(pthread_create(&th[i], NULL, par_main, &args[i]), 0);
	}
	for (int i = 0; i < 2; i++) {
		pthread_join(th[i], NULL);
		cr_expect_eq(args[i].err, 0);
		cr_expect(memcmp(args[i].logits, want[i], args[i].n * 512 * sizeof(float)) == 0,
			  "instance %d differs", i);
		free(args[i].logits);
		free(want[i]);
	}
	free(ids);
	nl_vocab_free(v);
	nl_model_free(m);
}

struct hook_state {
	uint32_t n_layers, hidden;
	size_t n;
	float *gate;     /* [n_layers, n, hidden] gathered from the hook */
	uint32_t calls;
	uint32_t stop_at;
};

static int gather_hook(void *ctx, uint32_t layer, uint32_t pos0, uint32_t n_tok,
		       const float *gate_act, uint32_t hidden_dim)
{
	struct hook_state *s = ctx;

	cr_assert_eq(hidden_dim, s->hidden);
	cr_assert_lt(layer, s->n_layers);
	cr_assert_leq(pos0 + n_tok, s->n);
	memcpy(s->gate + ((size_t)layer * s->n + pos0) * hidden_dim, gate_act,
	       (size_t)n_tok * hidden_dim * sizeof(float));
	s->calls++;
	return s->calls == s->stop_at ? 42 : 0;
}

Test(model, forward_hook_gate_activations)
{
	struct nl_model *m = open_model(data_path("models/stories260K/stories260K.bin"));
	struct nl_vocab *v = open_tok512();
	uint32_t *ids;
	size_t n;

	ids = first_story(v, &n);
	n = 60;
	for (int relu = 0; relu < 2; relu++) {
		struct hook_state s = { 5, 172, n, NULL, 0, 0 };
		struct nl_ref *ref = nl_ref_create(m, relu);
		struct nl_forward *f;
		float row[512], *gate = malloc(5 * 172 * sizeof(float));
		double worst = 0.0;
		size_t zeros = 0;

		s.gate = calloc(5 * n * 172, sizeof(float));
		cr_assert_eq(nl_forward_create(&f, m, relu ? NL_FFN_RELU : NL_FFN_SWIGLU, 1), 0);
		cr_assert_eq(nl_forward_set_block(f, 16), 0);
		cr_assert_eq(nl_forward_sequence(f, ids, n, gather_hook, &s, NULL), 0);
		cr_expect_eq(s.calls, 5 * 4, "hook calls: %u, expected 5 layers x 4 blocks", s.calls);
		for (size_t t = 0; t < n; t++) {
			nl_ref_step(ref, ids[t], (uint32_t)t, row, gate);
			for (uint32_t l = 0; l < 5; l++) {
				const float *got = s.gate + ((size_t)l * n + t) * 172;
				double d = max_abs_diff(got, gate + l * 172, 172);

				if (d > worst)
					worst = d;
				for (uint32_t i = 0; i < 172; i++) {
					zeros += got[i] == 0.0f;
					if (relu)
						cr_assert_geq(got[i], 0.0f);
				}
			}
		}
		cr_expect_lt(worst, 1e-3, "gate activations differ from run.c by %g", worst);
		if (relu)
			cr_expect_gt(zeros, n * 5 * 172 / 10, "ReGLU should zero many gates");
		else
			cr_expect_lt(zeros, n * 5 * 172 / 100);
		/* a non-zero hook return stops the pass and is returned */
		s.calls = 0;
		s.stop_at = 3;
		cr_expect_eq(nl_forward_sequence(f, ids, n, gather_hook, &s, NULL), 42);
		cr_expect_eq(s.calls, 3);
		nl_forward_free(f);
		nl_ref_free(ref);
		free(gate);
		free(s.gate);
	}
	free(ids);
	nl_vocab_free(v);
	nl_model_free(m);
}

Test(model, forward_rejects_bad_input)
{
	struct nl_model *m = open_model(data_path("models/stories260K/stories260K.bin"));
	struct nl_forward *f;
	uint32_t *ids = calloc(600, sizeof(uint32_t));
	int err;

	cr_assert_eq(nl_forward_create(&f, m, NL_FFN_SWIGLU, 1), 0);
	err = nl_forward_sequence(f, ids, 513, NULL, NULL, NULL);
	cr_expect_eq(err, NL_E_INVAL);
	cr_expect(strstr(nl_diag_msg(), "seq_len 512"), "%s", nl_diag_msg());
	ids[5] = 512;
	err = nl_forward_sequence(f, ids, 10, NULL, NULL, NULL);
	cr_expect_eq(err, NL_E_INVAL);
	cr_expect(strstr(nl_diag_msg(), "token 5 has id 512"), "%s", nl_diag_msg());
	cr_expect_eq(nl_forward_sequence(f, ids, 0, NULL, NULL, NULL), 0);
	nl_forward_free(f);
	nl_forward_free(NULL);
	free(ids);
	nl_model_free(m);
}

/* ---- rejects: each with its code and a diagnostic naming the field ---- */

static void expect_reject(const char *path, int want, const char *needle)
{
	struct nl_model *m = NULL;
	int err = nl_model_open(&m, path);

	cr_expect_eq(err, want, "'%s': got %d (%s), expected %d (%s): %s", path, err,
		     nl_strerror(err), want, nl_strerror(want), nl_diag_msg());
	cr_expect_null(m);
	cr_expect(strstr(nl_diag_msg(), needle), "diagnostic '%s' does not mention '%s'",
		  nl_diag_msg(), needle);
}

Test(model, reject_llama2c)
{
	size_t len;
	char *bin = read_all(data_path("models/stories260K/stories260K.bin"), &len);
	const char *p = tmp_path("bad.bin");

	write_all(p, bin, len - 4);
	expect_reject(p, NL_E_TRUNCATED, "implies 1056540");
	write_all(p, bin, len + 4 < len ? len : len);  /* sanity: the intact copy opens */
	nl_model_free(open_model(p));
	{
		char *longer = calloc(1, len + 8);

		memcpy(longer, bin, len);
		write_all(p, longer, len + 8);
		expect_reject(p, NL_E_FORMAT, "8 bytes too many");
		free(longer);
	}
	write_all(p, bin, 10);
	expect_reject(p, NL_E_TRUNCATED, "too short");
	write_all(p, "this is a text file, not a model at all\n", 40);
	expect_reject(p, NL_E_MAGIC, "not a GGUF or llama2.c checkpoint");
	bin[12] = 7;  /* n_heads 7 does not divide dim 64 */
	write_all(p, bin, len);
	expect_reject(p, NL_E_MAGIC, "n_heads is 7");
	write_all(p, "", 0);
	expect_reject(p, NL_E_TRUNCATED, "0 bytes");
	expect_reject(tmp_path("missing.bin"), -ENOENT, "missing.bin");
	{
		/* v1 headers: unknown version, the int8 version 2, non-zero padding */
		uint8_t hdr[300] = { 0x32, 0x34, 0x6b, 0x61, 7 };

		write_all(p, hdr, sizeof(hdr));
		expect_reject(p, NL_E_VERSION, "version is 7");
		hdr[4] = 2;
		write_all(p, hdr, sizeof(hdr));
		expect_reject(p, NL_E_UNSUPPORTED, "version 2");
		hdr[4] = 1;
		hdr[100] = 1;
		write_all(p, hdr, sizeof(hdr));
		expect_reject(p, NL_E_RESERVED, "padding byte 100");
	}
	free(bin);
}

static struct gw *stories_gguf(struct nl_model **m)
{
	*m = open_model(data_path("models/stories260K/stories260K.bin"));
	return gw_from_model(*m, NL_GGML_F32);
}

Test(model, reject_gguf)
{
	const char *p = tmp_path("bad.gguf");
	struct nl_model *m;
	struct gw *g;
	size_t len, size;
	char *f32 = read_all(data_path("models/stories260K/stories260K-f32.gguf"), &len);
	uint8_t *bytes;

	/* truncated inside the data section: the tensor that runs past the end is named */
	write_all(p, f32, len - 100);
	expect_reject(p, NL_E_TRUNCATED, "'output_norm.weight'");
	/* truncated inside the metadata */
	write_all(p, f32, 300);
	expect_reject(p, NL_E_TRUNCATED, "tensor_count is 47, more than the file's 300 bytes");
	/* inside the token array: more strings claimed than bytes left */
	write_all(p, f32, 2000);
	expect_reject(p, NL_E_TRUNCATED, "key 'tokenizer.ggml.tokens' claims 512 array elements");
	write_all(p, f32, 6000);
	expect_reject(p, NL_E_TRUNCATED, "tokenizer.ggml.tokens at offset");
	/* wrong version */
	f32[4] = 9;
	write_all(p, f32, len);
	expect_reject(p, NL_E_VERSION, "GGUF version is 9");
	f32[4] = 3;
	/* absurd counts are refused before allocating */
	memcpy(f32 + 8, "\xff\xff\xff\xff\xff\xff\xff\x0f", 8);
	write_all(p, f32, len);
	expect_reject(p, NL_E_FORMAT, "tensor_count is 1152921504606846975");
	memcpy(f32 + 8, "\x2f\0\0\0\0\0\0\0", 8);
	memcpy(f32 + 16, "\0\0\0\0\0\0\0\x40", 8);
	write_all(p, f32, len);
	expect_reject(p, NL_E_FORMAT, "metadata_kv_count is 4611686018427387904");

	/* a key whose array claims more elements than the file could hold */
	{
		static const uint8_t arr[] = {
			'G', 'G', 'U', 'F', 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0,
			4, 0, 0, 0, 0, 0, 0, 0, 'k', 'e', 'y', 's', 9, 0, 0, 0, 4, 0, 0, 0,
			0, 0, 0, 0, 0, 0, 0, 0x20, 1, 2, 3, 4,
		};

		write_all(p, arr, sizeof(arr));
		expect_reject(p, NL_E_FORMAT, "key 'keys' claims 2305843009213693952 array elements");
	}
	free(f32);

	g = stories_gguf(&m);
	cr_assert_eq(gw_write(g, p), 0);
	nl_model_free(open_model(p));  /* the writer itself is sound */
	{
		uint64_t ne[2] = { 64, 48 };
		float *zeros = calloc(64 * 48, sizeof(float));

		gw_replace_tensor(g, "blk.0.attn_k.weight", 2, ne, NL_GGML_F32, zeros,
				  64 * 48 * sizeof(float));
		free(zeros);
	}
	cr_assert_eq(gw_write(g, p), 0);
	expect_reject(p, NL_E_SHAPE, "tensor 'blk.0.attn_k.weight' has shape [64, 48, 1, 1] "
		      "(fastest first), expected [64, 32]");
	gw_free(g);

	g = gw_from_model(m, NL_GGML_F32);
	{
		uint64_t ne[2] = { 64, 172 };
		uint8_t *q4 = calloc(64 * 172, 1);

		gw_replace_tensor(g, "blk.1.ffn_up.weight", 2, ne, 2 /* Q4_0 */, q4, 64 * 172 / 32 * 18);
		free(q4);
	}
	cr_assert_eq(gw_write(g, p), 0);
	expect_reject(p, NL_E_TYPE, "tensor 'blk.1.ffn_up.weight' has type 2 (Q4_0)");
	gw_free(g);

	g = gw_from_model(m, NL_GGML_F32);
	{
		uint64_t ne[1] = { 64 };
		float ones[64] = { 1.0f };

		gw_tensor(g, "output_norm.weight", 1, ne, NL_GGML_F32, ones);
	}
	cr_assert_eq(gw_write(g, p), 0);
	expect_reject(p, NL_E_FORMAT, "tensor 'output_norm.weight' appears twice");
	gw_free(g);

	g = gw_from_model(m, NL_GGML_F32);
	gw_kv_u32(g, "general.alignment", 48);
	cr_assert_eq(gw_write(g, p), 0);
	expect_reject(p, NL_E_FORMAT, "general.alignment is 48, expected a power of two");
	gw_free(g);

	g = gw_from_model(m, NL_GGML_F32);
	gw_remove_tensor(g, "blk.4.ffn_down.weight");
	cr_assert_eq(gw_write(g, p), 0);
	expect_reject(p, NL_E_MISSING, "tensor 'blk.4.ffn_down.weight' is missing");
	/* another architecture */
	bytes = gw_bytes(g, 3, 32, &size);
	{
		uint8_t *arch = memmem(bytes, size, "llama", 5);

		cr_assert_not_null(arch);
		memcpy(arch, "gpt2x", 5);
	}
	write_all(p, bytes, size);
	expect_reject(p, NL_E_UNSUPPORTED, "general.architecture is 'gpt2x'");
	free(bytes);
	gw_free(g);
	nl_model_free(m);
}

Test(model, reject_tokenizer)
{
	size_t len;
	char *tok = read_all(data_path("models/stories260K/tok512.bin"), &len);
	const char *p = tmp_path("tok.bin");
	struct nl_vocab *v = NULL;
	int err;

	write_all(p, tok, len - 3);
	err = nl_vocab_open_llama2c(&v, p, 512);
	cr_expect_eq(err, NL_E_TRUNCATED, "%d %s", err, nl_diag_msg());
	cr_expect(strstr(nl_diag_msg(), "token 511"), "%s", nl_diag_msg());
	write_all(p, tok, len);
	err = nl_vocab_open_llama2c(&v, p, 500);
	cr_expect_eq(err, NL_E_MISMATCH, "%d %s", err, nl_diag_msg());
	cr_expect(strstr(nl_diag_msg(), "vocab_size 500"), "%s", nl_diag_msg());
	err = nl_vocab_open_llama2c(&v, p, 600);
	cr_expect_eq(err, NL_E_TRUNCATED, "%d %s", err, nl_diag_msg());
	tok[8] = (char)0xff;  /* token 0 length 0x7f0000ff */
	tok[11] = 0x7f;
	write_all(p, tok, len);
	err = nl_vocab_open_llama2c(&v, p, 512);
	cr_expect_eq(err, NL_E_FORMAT, "%d %s", err, nl_diag_msg());
	cr_expect(strstr(nl_diag_msg(), "token 0 has length"), "%s", nl_diag_msg());
	cr_expect_null(v);
	/* a GGUF without a vocabulary */
	{
		struct nl_model *m = open_model(data_path("models/stories260K/stories260K.bin"));
		struct gw *g = gw_from_model(m, NL_GGML_F32);

		cr_assert_eq(gw_write(g, tmp_path("novocab.gguf")), 0);
		err = nl_vocab_open_gguf(&v, tmp_path("novocab.gguf"));
		cr_expect_eq(err, NL_E_MISSING);
		cr_expect(strstr(nl_diag_msg(), "tokenizer.ggml.tokens"), "%s", nl_diag_msg());
		gw_free(g);
		nl_model_free(m);
	}
	free(tok);
}

/* The fuzz seeds must be inputs the readers accept, or fuzzing starts from nothing. */
Test(model, fuzz_seeds_load)
{
	static const char *const models[] = {
		"tiny-f32.gguf", "tiny-f16.gguf", "tiny-bf16.gguf", "tiny-q8_0.gguf",
		"tiny-unshared-f32.gguf", "tiny-v0-shared.bin", "tiny-v0-unshared.bin",
		"tiny-v1-shared.bin", "tiny-v1-unshared.bin",
	};
	const char *root = getenv("NL_SOURCE_ROOT");
	char path[2048];
	struct nl_vocab *a, *b;
	uint32_t *ia, *ib;
	size_t na, nb;

	if (!root)
		cr_skip_test("NL_SOURCE_ROOT not set");
	for (size_t i = 0; i < sizeof(models) / sizeof(models[0]); i++) {
		struct nl_model *m;

		snprintf(path, sizeof(path), "%s/tests/model/corpus/%s", root, models[i]);
		m = open_model(path);
		cr_expect_eq(nl_model_get_config(m)->vocab_size, 12);
		nl_model_free(m);
	}
	snprintf(path, sizeof(path), "%s/tests/model/corpus/tiny-tokenizer.bin", root);
	cr_assert_eq(nl_vocab_open_llama2c(&a, path, 12), 0, "%s", nl_diag_msg());
	snprintf(path, sizeof(path), "%s/tests/model/corpus/tiny-f32.gguf", root);
	cr_assert_eq(nl_vocab_open_gguf(&b, path), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_vocab_encode(a, "ab a\n\xc3\xa9x", 8, true, &ia, &na), 0);
	cr_assert_eq(nl_vocab_encode(b, "ab a\n\xc3\xa9x", 8, true, &ib, &nb), 0);
	cr_expect_eq(na, nb);
	cr_expect(na == nb && !memcmp(ia, ib, na * sizeof(*ia)));
	/* BOS, " ab", " a", <0x0A>, "é", then 'x' has no byte token: unk */
	cr_expect_eq(na, 6);
	cr_expect_eq(ia[1], 10);
	cr_expect_eq(ia[2], 8);
	cr_expect_eq(ia[3], 3);
	cr_expect_eq(ia[4], 11);
	cr_expect_eq(ia[5], 0);
	free(ia);
	free(ib);
	nl_vocab_free(a);
	nl_vocab_free(b);
}
