/*
 * bench-profiler: throughput of the profiler's forward pass (tokens/s) against
 * a plain run.c-style implementation (ref_runc.c: one token at a time, naive
 * matrix-vector products, single thread) measured in the same run, and the
 * speed of the BPE encoder on a long text against llama2.c's encode().
 *
 *   bench-profiler [--data DIR] [--quick]
 *
 * Models: stories260K (real weights) and a synthetic Llama of a realistic
 * small shape (dim 768, FFN 2048, 6 layers, 12 heads, vocab 32000) with random
 * weights, for timing only. Output: Markdown tables on stdout.
 */
#include <getopt.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nl_cli.h"
#include "nl_model_internal.h"
#include "nl_profile.h"
#include "ref_runc.h"

static const char usage[] = "Usage: bench-profiler [--data DIR] [--quick]\n";

static char *read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long size;

	if (!f)
		nl_die("cannot open '%s'", path);
	fseek(f, 0, SEEK_END);
	size = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)size + 1);
	if (!buf || fread(buf, 1, (size_t)size, f) != (size_t)size)
		nl_die("cannot read '%s'", path);
	buf[size] = '\0';
	fclose(f);
	*len = (size_t)size;
	return buf;
}

/* ---- synthetic model ---- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static float uniform(void)
{
	/* xorshift64*: reproducible weights in [-1, 1) */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return (float)((rng_state * 2685821657736338717ull) >> 40) / (float)(1 << 23) - 1.0f;
}

static void fill(float *p, size_t n, float scale)
{
	for (size_t i = 0; i < n; i++)
		p[i] = uniform() * scale;
}

static struct nl_model *synthetic_model(uint32_t dim, uint32_t hidden, uint32_t layers,
					uint32_t heads, uint32_t vocab, uint32_t seq)
{
	struct nl_model *m = calloc(1, sizeof(*m));
	struct nl_model_config *c;
	size_t D = dim, H = hidden, V = vocab, total;
	float *p;

	if (!m)
		nl_die("out of memory");
	c = &m->config;
	c->dim = dim;
	c->hidden_dim = hidden;
	c->n_layers = layers;
	c->n_heads = heads;
	c->n_kv_heads = heads;
	c->vocab_size = vocab;
	c->seq_len = seq;
	c->rms_eps = 1e-5f;
	c->rope_theta = 10000.0f;
	c->shared_classifier = true;
	snprintf(c->name, sizeof(c->name), "synthetic-%ux%ux%u", dim, hidden, layers);
	if (nl_model_check_config(c, "synthetic"))
		nl_die("%s", nl_diag_msg());
	total = V * D + layers * (2 * D + 4 * D * D + 3 * H * D) + D;
	if (nl_model_alloc(m, total))
		nl_die("%s", nl_diag_msg());
	p = m->arena;
	m->weights.token_embedding = p;
	fill(p, V * D, 1.0f);
	p += V * D;
	for (uint32_t l = 0; l < layers; l++) {
		struct nl_layer_weights *lw = &m->layers[l];
		float s_in = 1.0f / sqrtf((float)D), s_h = 1.0f / sqrtf((float)H);

		lw->attn_norm = p;
		for (size_t i = 0; i < D; i++)
			p[i] = 1.0f;
		p += D;
		lw->ffn_norm = p;
		for (size_t i = 0; i < D; i++)
			p[i] = 1.0f;
		p += D;
		lw->wq = p; fill(p, D * D, s_in); p += D * D;
		lw->wk = p; fill(p, D * D, s_in); p += D * D;
		lw->wv = p; fill(p, D * D, s_in); p += D * D;
		lw->wo = p; fill(p, D * D, s_in); p += D * D;
		lw->w_gate = p; fill(p, H * D, s_in); p += H * D;
		lw->w_up = p; fill(p, H * D, s_in); p += H * D;
		lw->w_down = p; fill(p, D * H, s_h); p += D * H;
	}
	m->weights.final_norm = p;
	for (size_t i = 0; i < D; i++)
		p[i] = 1.0f;
	m->weights.classifier = m->weights.token_embedding;
	return m;
}

/* ---- timing ---- */

/* CPU seconds of the whole process (all threads): robust to other load on the machine. */
static double cpu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

struct seqs {
	uint32_t **ids;
	size_t *n;
	size_t count;
	size_t tokens;
};

/* run.c-style over the first n_seqs sequences; seconds, *tokens counted */
static double time_reference(const struct nl_model *m, const struct seqs *s, size_t n_seqs,
			     size_t *tokens, float *out_last, double *cpu)
{
	const struct nl_model_config *c = nl_model_get_config(m);
	float *logits = malloc(c->vocab_size * sizeof(float));
	double t0 = nl_now(), c0 = cpu_now();

	*tokens = 0;
	for (size_t k = 0; k < n_seqs && k < s->count; k++) {
		struct nl_ref *r = nl_ref_create(m, false);

		*tokens += s->n[k];

		if (!r)
			nl_die("out of memory");
		for (size_t t = 0; t < s->n[k]; t++) {
			nl_ref_step(r, s->ids[k][t], (uint32_t)t, logits, NULL);
			if (out_last && k == 0)
				memcpy(out_last + t * c->vocab_size, logits,
				       c->vocab_size * sizeof(float));
		}
		nl_ref_free(r);
	}
	free(logits);
	*cpu = cpu_now() - c0;
	return nl_now() - t0;
}

struct worker {
	const struct nl_model *m;
	const struct seqs *s;
	uint32_t threads;     /* per instance */
	uint32_t first, step; /* sequences first, first + step, ... */
	bool logits;
	float *keep;          /* logits of sequence 0 when not NULL */
	int err;
};

static int count_hook(void *ctx, uint32_t layer, uint32_t pos0, uint32_t n_tok,
		      const float *gate_act, uint32_t hidden_dim)
{
	volatile float *sink = ctx;

	(void)layer;
	(void)pos0;
	*sink += gate_act[(size_t)n_tok * hidden_dim - 1];
	return 0;
}

static void *worker_main(void *p)
{
	struct worker *w = p;
	const struct nl_model_config *c = nl_model_get_config(w->m);
	struct nl_forward *f;
	float *logits = NULL;
	volatile float sink = 0.0f;
	size_t max_n = 0;

	for (size_t k = 0; k < w->s->count; k++)
		if (w->s->n[k] > max_n)
			max_n = w->s->n[k];
	if (w->logits)
		logits = malloc(max_n * c->vocab_size * sizeof(float));
	w->err = nl_forward_create(&f, w->m, NL_FFN_SWIGLU, w->threads);
	for (size_t k = w->first; k < w->s->count && !w->err; k += w->step) {
		w->err = nl_forward_sequence(f, w->s->ids[k], w->s->n[k], count_hook,
					     (void *)&sink, logits);
		if (!w->err && w->keep && k == 0)
			memcpy(w->keep, logits, w->s->n[0] * c->vocab_size * sizeof(float));
	}
	nl_forward_free(f);
	free(logits);
	return NULL;
}

/* instances x threads_each forward passes over the sequences; wall seconds, *cpu CPU seconds */
static double time_ours(const struct nl_model *m, const struct seqs *s, uint32_t instances,
			uint32_t threads_each, bool logits, float *keep, double *cpu)
{
	struct worker w[8];
	pthread_t th[8];
	double t0 = nl_now(), c0 = cpu_now();

	for (uint32_t i = 0; i < instances; i++) {
		w[i] = (struct worker){ m, s, threads_each, i, instances, logits,
					i == 0 ? keep : NULL, 0 };
		if (i && pthread_create(&th[i], NULL, worker_main, &w[i]))
			nl_die("cannot start a thread");
	}
	worker_main(&w[0]);
	for (uint32_t i = 1; i < instances; i++)
		pthread_join(th[i], NULL);
	for (uint32_t i = 0; i < instances; i++)
		if (w[i].err)
			nl_die("forward pass: %s", nl_diag_msg());
	*cpu = cpu_now() - c0;
	return nl_now() - t0;
}

static double max_diff(const float *a, const float *b, size_t n)
{
	double d = 0.0;

	for (size_t i = 0; i < n; i++)
		if (fabs((double)a[i] - b[i]) > d)
			d = fabs((double)a[i] - b[i]);
	return d;
}

static void bench_model(const char *label, const struct nl_model *m, const struct seqs *s,
			int reps, size_t ref_seqs)
{
	const struct nl_model_config *c = nl_model_get_config(m);
	size_t n0 = s->n[0] * c->vocab_size;
	float *ref_logits = malloc(n0 * sizeof(float)), *our_logits = malloc(n0 * sizeof(float));
	double base, base_cpu, t, cpu;
	size_t ref_tokens;
	struct { const char *what; uint32_t inst, thr; bool logits; } rows[] = {
		{ "ours, 1 thread, with logits", 1, 1, true },
		{ "ours, 1 thread, profiling (hook, no logits)", 1, 1, false },
		{ "ours, 2 threads splitting rows, profiling", 1, 2, false },
		{ "ours, 2 instances x 1 thread (as nl-profile), profiling", 2, 1, false },
	};

	if (!ref_logits || !our_logits)
		nl_die("out of memory");
	base = time_reference(m, s, ref_seqs, &ref_tokens, ref_logits, &base_cpu);
	/* scaled to all tokens */
	base = base / (double)ref_tokens * (double)s->tokens;
	base_cpu = base_cpu / (double)ref_tokens * (double)s->tokens;
	time_ours(m, s, 1, 1, true, our_logits, &cpu);
	printf("\n### %s\n\n", label);
	printf("%zu sequences, %zu tokens (run.c-style timed on the first %zu tokens); max "
	       "|logit difference| ours vs run.c-style on sequence 0: %.2g\n\n", s->count,
	       s->tokens, ref_tokens, max_diff(ref_logits, our_logits, n0));
	printf("| implementation | tokens/s (wall) | vs run.c-style | tokens per CPU-second | "
	       "vs run.c-style |\n|---|---:|---:|---:|---:|\n");
	printf("| run.c-style (per token, naive matmul, 1 thread, logits) | %.0f | 1.00 | %.0f | "
	       "1.00 |\n", (double)s->tokens / base, (double)s->tokens / base_cpu);
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		double best = 1e30, best_cpu = 1e30;

		for (int r = 0; r < reps; r++) {
			t = time_ours(m, s, rows[i].inst, rows[i].thr, rows[i].logits, NULL, &cpu);
			best = t < best ? t : best;
			best_cpu = cpu < best_cpu ? cpu : best_cpu;
		}
		printf("| %s | %.0f | %.2f | %.0f | %.2f |\n", rows[i].what,
		       (double)s->tokens / best, base / best, (double)s->tokens / best_cpu,
		       base_cpu / best_cpu);
	}
	fflush(stdout);
	free(ref_logits);
	free(our_logits);
}

/* ---- encoder ---- */

/* llama2.c's encode(): sorted vocabulary + bsearch, full rescan after each merge. */
struct sorted_tok {
	const char *str;
	uint32_t id;
};

static int cmp_tok(const void *a, const void *b)
{
	return strcmp(((const struct sorted_tok *)a)->str, ((const struct sorted_tok *)b)->str);
}

static int str_lookup(const char *s, const struct sorted_tok *sorted, uint32_t n)
{
	struct sorted_tok key = { s, 0 };
	const struct sorted_tok *r = bsearch(&key, sorted, n, sizeof(key), cmp_tok);

	return r ? (int)r->id : -1;
}

static size_t llama2c_encode(const struct nl_vocab *v, const struct sorted_tok *sorted,
			     uint32_t n_sorted, const char *text, uint32_t *tokens)
{
	char buf[128], str_buffer[8];
	size_t n = 0, str_len = 0;

	if (text[0])
		tokens[n++] = (uint32_t)str_lookup(" ", sorted, n_sorted);
	for (const char *c = text; *c; c++) {
		int id;

		if ((*c & 0xc0) != 0x80)
			str_len = 0;
		str_buffer[str_len++] = *c;
		str_buffer[str_len] = '\0';
		if ((*(c + 1) & 0xc0) == 0x80 && str_len < 4)
			continue;
		id = str_lookup(str_buffer, sorted, n_sorted);
		if (id != -1) {
			tokens[n++] = (uint32_t)id;
		} else {
			for (size_t i = 0; i < str_len; i++)
				tokens[n++] = (uint8_t)str_buffer[i] + 3u;
		}
		str_len = 0;
	}
	for (;;) {
		float best_score = -1e10f;
		int best_id = -1;
		size_t best_idx = 0;

		for (size_t i = 0; i + 1 < n; i++) {
			int id;

			snprintf(buf, sizeof(buf), "%s%s", nl_vocab_piece(v, tokens[i]),
				 nl_vocab_piece(v, tokens[i + 1]));
			id = str_lookup(buf, sorted, n_sorted);
			if (id != -1 && nl_vocab_score(v, (uint32_t)id) > best_score) {
				best_score = nl_vocab_score(v, (uint32_t)id);
				best_id = id;
				best_idx = i;
			}
		}
		if (best_id == -1)
			break;
		tokens[best_idx] = (uint32_t)best_id;
		memmove(tokens + best_idx + 1, tokens + best_idx + 2,
			(n - best_idx - 2) * sizeof(*tokens));
		n--;
	}
	return n;
}

static void bench_encoder(const struct nl_vocab *v, const char *text, size_t len, bool quick)
{
	uint32_t n_vocab = nl_vocab_size(v), n_sorted = 0;
	struct sorted_tok *sorted = malloc(n_vocab * sizeof(*sorted));
	static const size_t naive_sizes[] = { 4096, 8192, 16384 };
	size_t n_naive = quick ? 2 : 3;

	/* the tokens llama2.c could match in text (not unk/bos/eos) */
	for (uint32_t id = 3; id < n_vocab; id++)
		sorted[n_sorted++] = (struct sorted_tok){ nl_vocab_piece(v, id), id };
	qsort(sorted, n_sorted, sizeof(*sorted), cmp_tok);
	printf("\n### BPE encoder (tok512, WikiText-2 wiki.test.raw, %zu bytes)\n\n", len);
	printf("| input | bytes | ours: ms | ours: MB/s | llama2.c encode(): ms | same ids |\n");
	printf("|---|---:|---:|---:|---:|---|\n");
	for (size_t k = 0; k < n_naive + 4; k++) {
		size_t bytes = k < n_naive ? naive_sizes[k] : len >> (3 - (k - n_naive));
		char *chunk = malloc(bytes + 1);
		uint32_t *ids, *naive = NULL;
		size_t n, nn = 0;
		double t0, ours, theirs = 0.0;

		memcpy(chunk, text, bytes);
		chunk[bytes] = '\0';
		for (size_t i = 0; i < bytes; i++)
			if (!chunk[i])
				chunk[i] = ' ';
		t0 = nl_now();
		if (nl_vocab_encode(v, chunk, bytes, false, &ids, &n))
			nl_die("encode: %s", nl_diag_msg());
		ours = nl_now() - t0;
		if (k < n_naive) {
			naive = malloc((bytes + 2) * sizeof(*naive));
			t0 = nl_now();
			nn = llama2c_encode(v, sorted, n_sorted, chunk, naive);
			theirs = nl_now() - t0;
		}
		printf("| %s | %zu | %.2f | %.1f | ", k < n_naive ? "prefix" :
		       bytes == len ? "whole file" : "prefix", bytes, ours * 1e3,
		       (double)bytes / ours / 1e6);
		if (naive)
			printf("%.1f | %s |\n", theirs * 1e3,
			       nn == n && !memcmp(ids, naive, n * sizeof(*ids)) ? "yes" : "NO");
		else
			printf("- | - |\n");
		fflush(stdout);
		free(naive);
		free(ids);
		free(chunk);
	}
	free(sorted);
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "data", required_argument, NULL, 'd' },
		{ "quick", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	const char *data = getenv("NL_DATA_DIR");
	char path[2048];
	struct nl_model *m;
	struct nl_vocab *v;
	struct seqs s = { 0 };
	bool quick = false;
	char *text;
	size_t len;
	int opt, err;

	nl_cli_init("bench-profiler");
	while ((opt = getopt_long(argc, argv, "d:qh", opts, NULL)) != -1) {
		switch (opt) {
		case 'd': data = optarg; break;
		case 'q': quick = true; break;
		case 'h': fputs(usage, stdout); return 0;
		default: nl_usage_error(usage, "unknown option");
		}
	}
	if (!data)
		data = "../shared/data";

	/* stories260K on the five TinyStories stories of the reference test */
	snprintf(path, sizeof(path), "%s/models/stories260K/stories260K.bin", data);
	if ((err = nl_model_open(&m, path)))
		nl_die_err(err, NULL);
	snprintf(path, sizeof(path), "%s/models/stories260K/tok512.bin", data);
	if ((err = nl_vocab_open_llama2c(&v, path, 512)))
		nl_die_err(err, NULL);
	snprintf(path, sizeof(path), "%s/text/tinystories/tinystories_sample_cs336.txt", data);
	text = read_file(path, &len);
	s.ids = calloc(64, sizeof(*s.ids));
	s.n = calloc(64, sizeof(*s.n));
	for (int rep = 0; rep < (quick ? 2 : 8); rep++) {
		char *p = text;

		for (;;) {
			char *e = strstr(p, "<|endoftext|>");
			size_t l = e ? (size_t)(e - p) : strlen(p);

			while (l && (*p == ' ' || *p == '\n')) {
				p++;
				l--;
			}
			while (l && (p[l - 1] == ' ' || p[l - 1] == '\n'))
				l--;
			if (l) {
				nl_vocab_encode(v, p, l, true, &s.ids[s.count], &s.n[s.count]);
				s.tokens += s.n[s.count++];
			}
			if (!e)
				break;
			p = e + 13;
		}
	}
	printf("## Forward pass throughput\n\nMachine: %ld online CPUs. Best of %d runs "
	       "(run.c-style: 1 run). Profiling = FFN hook called, no classifier. Tokens per "
	       "CPU-second counts the CPU time of all threads: it stays flat when two threads "
	       "scale perfectly, and it is what other load on the machine disturbs least.\n",
	       sysconf(_SC_NPROCESSORS_ONLN), quick ? 1 : 3);
	bench_model("stories260K (real weights: dim 64, FFN 172, 5 layers, vocab 512)", m, &s,
		    quick ? 1 : 3, s.count);
	nl_model_free(m);
	for (size_t k = 0; k < s.count; k++)
		free(s.ids[k]);
	free(text);

	/* synthetic shape: 4 sequences of 256 random tokens */
	{
		uint32_t seq = quick ? 64 : 256;
		struct seqs syn = { 0 };

		m = synthetic_model(768, 2048, 6, 12, 32000, 1024);
		syn.ids = s.ids;
		syn.n = s.n;
		syn.count = 4;
		for (size_t k = 0; k < syn.count; k++) {
			syn.ids[k] = malloc(seq * sizeof(uint32_t));
			for (uint32_t t = 0; t < seq; t++)
				syn.ids[k][t] = (uint32_t)((uniform() + 1.0f) * 15999.0f);
			syn.n[k] = seq;
			syn.tokens += seq;
		}
		bench_model("SYNTHETIC random weights, realistic shape (dim 768, FFN 2048, 6 layers, "
			    "12 heads, vocab 32000): timing only", m, &syn, quick ? 1 : 3, 1);
		for (size_t k = 0; k < syn.count; k++)
			free(syn.ids[k]);
		nl_model_free(m);
	}

	snprintf(path, sizeof(path), "%s/text/wikitext2/wiki.test.raw", data);
	text = read_file(path, &len);
	bench_encoder(v, text, len, quick);
	free(text);
	free(s.ids);
	free(s.n);
	nl_vocab_free(v);
	return 0;
}
