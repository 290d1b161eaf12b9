/*
 * Profiler stage: sparsity rules on hand-made activations, threshold
 * calibration, dataset readers on small fixtures (and the real datasets),
 * deterministic selection and the train/test split, the .npy importer, the
 * synthetic generator and the nl-profile program end to end.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nl_profile.h"

#ifndef NL_PROFILE_EXE
#error "NL_PROFILE_EXE must be defined by meson"
#endif

/* ---- helpers ---- */

static char tmpdir[256];

static void make_tmpdir(void)
{
	if (tmpdir[0])
		return;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/nl-test-profiler-XXXXXX");
	cr_assert_not_null(mkdtemp(tmpdir));
}

static void tmp_path(char *buf, size_t size, const char *name)
{
	make_tmpdir();
	snprintf(buf, size, "%s/%s", tmpdir, name);
}

static void write_file(const char *path, const void *data, size_t len)
{
	FILE *f = fopen(path, "wb");

	cr_assert_not_null(f, "cannot create %s", path);
	cr_assert_eq(fwrite(data, 1, len, f), len);
	fclose(f);
}

static const char *fixture(const char *name, const char *text)
{
	static char path[512];

	tmp_path(path, sizeof(path), name);
	write_file(path, text, strlen(text));
	return path;
}

static struct nl_dataset *open_ds(const char *path, enum nl_ds_format fmt, const char *fields,
				  const char *sep)
{
	struct nl_dataset_opts o = { .format = fmt, .fields = fields, .separator = sep };
	struct nl_dataset *d = NULL;
	int err = nl_dataset_open(&d, path, &o);

	cr_assert_eq(err, 0, "open %s: %d %s", path, err, nl_diag_msg());
	return d;
}

static int open_ds_err(const char *path, enum nl_ds_format fmt, const char *fields)
{
	struct nl_dataset_opts o = { .format = fmt, .fields = fields };
	struct nl_dataset *d = NULL;
	int err = nl_dataset_open(&d, path, &o);

	cr_assert_null(d);
	return err;
}

static const char *text_of(const struct nl_dataset *d, size_t i)
{
	const struct nl_sample *s = nl_dataset_sample(d, i);

	cr_assert_not_null(s);
	return s->text;
}

static const char *data_dir(void)
{
	const char *d = getenv("NL_DATA_DIR");
	char probe[1024];

	if (!d)
		return NULL;
	snprintf(probe, sizeof(probe), "%s/models/stories260K/stories260K.bin", d);
	return access(probe, R_OK) == 0 ? d : NULL;
}

/* Runs a shell command line; returns the exit status, stdout/stderr in files. */
static int run_cmd(const char *args, char *out, size_t out_size, char *errbuf, size_t err_size)
{
	char cmd[4096], outp[512], errp[512];
	FILE *f;
	int st;
	size_t n;

	tmp_path(outp, sizeof(outp), "cmd.out");
	tmp_path(errp, sizeof(errp), "cmd.err");
	snprintf(cmd, sizeof(cmd), "%s %s >%s 2>%s", NL_PROFILE_EXE, args, outp, errp);
	st = system(cmd);
	cr_assert(WIFEXITED(st), "command did not exit: %s", cmd);
	if (out) {
		f = fopen(outp, "r");
		n = f ? fread(out, 1, out_size - 1, f) : 0;
		out[n] = 0;
		if (f)
			fclose(f);
	}
	if (errbuf) {
		f = fopen(errp, "r");
		n = f ? fread(errbuf, 1, err_size - 1, f) : 0;
		errbuf[n] = 0;
		if (f)
			fclose(f);
	}
	return WEXITSTATUS(st);
}

/* ---- sparsity rules ---- */

Test(sparsity, relu_exact_zeros)
{
	const float act[] = { 0.0f, 1.5f, -2.0f, -0.0f, 3e-8f, NAN, 1e-38f, -1e-30f };
	uint32_t ids[8], n = nl_active_relu(act, 8, ids);

	cr_assert_eq(n, 3);
	cr_assert_eq(ids[0], 1);
	cr_assert_eq(ids[1], 4);
	cr_assert_eq(ids[2], 6);
}

Test(sparsity, threshold_strictly_greater_magnitude)
{
	const float act[] = { 0.4f, -0.6f, 0.5f, 0.51f, -0.5f, NAN, -INFINITY, 0.0f };
	uint32_t ids[8], n = nl_active_threshold(act, 8, 0.5, ids);

	cr_assert_eq(n, 3);
	cr_assert_eq(ids[0], 1);
	cr_assert_eq(ids[1], 3);
	cr_assert_eq(ids[2], 6);
	/* t = 0: every non-zero value. */
	n = nl_active_threshold(act, 8, 0, ids);
	cr_assert_eq(n, 6);
}

Test(sparsity, topk_ties_to_lower_id)
{
	const float act[] = { 1.0f, -3.0f, 2.0f, -2.0f, 0.5f, NAN };
	uint32_t ids[6];
	uint64_t scratch[6];

	cr_assert_eq(nl_active_topk(act, 6, 3, ids, scratch), 3);
	cr_assert_eq(ids[0], 1);
	cr_assert_eq(ids[1], 2);
	cr_assert_eq(ids[2], 3);
	/* |2| at ids 2 and 3: the lower id wins. */
	cr_assert_eq(nl_active_topk(act, 6, 2, ids, scratch), 2);
	cr_assert_eq(ids[0], 1);
	cr_assert_eq(ids[1], 2);
	/* NaN ranks below everything, even 0.5. */
	cr_assert_eq(nl_active_topk(act, 6, 5, ids, scratch), 5);
	cr_assert_eq(ids[4], 4);
	cr_assert_eq(nl_active_topk(act, 6, 6, ids, scratch), 6);
	cr_assert_eq(nl_active_topk(act, 6, 0, ids, scratch), 0);
}

/* Brute force: rank by (|a| desc, id asc) with a full sort. */
static int cmp_rank(const void *x, const void *y, void *ctx)
{
	const float *a = ctx;
	uint32_t i = *(const uint32_t *)x, j = *(const uint32_t *)y;
	float ai = fabsf(a[i]), aj = fabsf(a[j]);

	if (ai != aj)
		return ai > aj ? -1 : 1;
	return i < j ? -1 : 1;
}

Test(sparsity, topk_matches_full_sort)
{
	enum { N = 1000 };
	float act[N];
	uint32_t ids[N], order[N], expect[N];
	uint64_t scratch[N];
	uint32_t seed = 12345;

	for (int i = 0; i < N; i++) {
		seed = seed * 1103515245u + 12345u;
		/* Few distinct values: many ties. */
		act[i] = (float)((int)(seed >> 16) % 41 - 20) / 4.0f;
		order[i] = (uint32_t)i;
	}
	qsort_r(order, N, sizeof(order[0]), cmp_rank, act);
	for (uint32_t k = 1; k <= N; k += 37) {
		uint32_t n = nl_active_topk(act, N, k, ids, scratch);
		bool in[N] = { 0 };
		uint32_t m = 0;

		cr_assert_eq(n, k);
		for (uint32_t i = 0; i < k; i++)
			in[order[i]] = true;
		for (uint32_t i = 0; i < N; i++)
			if (in[i])
				expect[m++] = i;
		for (uint32_t i = 0; i < k; i++)
			cr_assert_eq(ids[i], expect[i], "k=%u position %u", k, i);
	}
}

Test(sparsity, topk_count)
{
	cr_assert_eq(nl_topk_count(0.3, 172), 52);
	cr_assert_eq(nl_topk_count(0.001, 100), 1);
	cr_assert_eq(nl_topk_count(1.0, 100), 100);
	cr_assert_eq(nl_topk_count(0.0, 100), 0);
	cr_assert_eq(nl_topk_count(0.25, 172), 43);
}

Test(sparsity, threshold_calibration_hits_density)
{
	struct nl_thresh_hist *h, *h2;
	float vals[1000];
	uint32_t ids[1000];
	double t;

	cr_assert_eq(nl_thresh_hist_create(&h, 2), 0);
	cr_assert_eq(nl_thresh_hist_create(&h2, 2), 0);
	for (int i = 0; i < 1000; i++)
		vals[i] = (float)((i % 2 ? -1 : 1) * (i + 1));  /* |x| = 1..1000 */
	nl_thresh_hist_add(h, 1, vals, 500);
	nl_thresh_hist_add(h2, 1, vals + 500, 500);
	cr_assert_eq(nl_thresh_hist_merge(h, h2), 0);
	for (int pct = 1; pct < 100; pct += 7) {
		uint32_t n;

		cr_assert_eq(nl_thresh_hist_threshold(h, 1, pct / 100.0, &t), 0);
		n = nl_active_threshold(vals, 1000, t, ids);
		cr_assert(n >= (uint32_t)(pct * 10 - 1) && n <= (uint32_t)(pct * 10 + 1),
			  "density %d%%: threshold %g gives %u of 1000", pct, t, n);
	}
	/* Layer 0 saw nothing: a clear error, not a silent 0. */
	cr_assert_eq(nl_thresh_hist_threshold(h, 0, 0.3, &t), NL_E_INVAL);
	cr_assert_eq(nl_thresh_hist_threshold(h, 1, 0, &t), NL_E_INVAL);
	/* More density than non-zero values: t = 0. */
	{
		float z[10] = { 0, 0, 0, 0, 0, 0, 0, 0, 1, 2 };

		nl_thresh_hist_add(h2, 0, z, 10);
		cr_assert_eq(nl_thresh_hist_threshold(h2, 0, 0.5, &t), 0);
		cr_assert_eq(t, 0.0);
	}
	nl_thresh_hist_free(h);
	nl_thresh_hist_free(h2);
}

/* ---- datasets ---- */

Test(dataset, text_paragraphs_crlf)
{
	const char *p = fixture("para.txt", "\r\n  first line\r\nsecond line  \r\n\r\n \t\r\n\r\nthird\n\n\nfourth\n");
	struct nl_dataset *d = open_ds(p, NL_DS_TEXT, NULL, NULL);

	cr_assert_eq(nl_dataset_count(d), 3);
	cr_assert_str_eq(text_of(d, 0), "first line\nsecond line");
	cr_assert_str_eq(text_of(d, 1), "third");
	cr_assert_str_eq(text_of(d, 2), "fourth");
	cr_assert_eq(nl_dataset_sample(d, 0)->line, 2);
	cr_assert_eq(nl_dataset_sample(d, 1)->line, 7);
	nl_dataset_free(d);
}

Test(dataset, text_separator_and_lines)
{
	const char *p = fixture("sep.txt", "  story one\nends<|endoftext|>\nstory two<|endoftext|>  <|endoftext|>three");
	struct nl_dataset *d = open_ds(p, NL_DS_TEXT, NULL, "<|endoftext|>");

	cr_assert_eq(nl_dataset_count(d), 3);
	cr_assert_str_eq(text_of(d, 0), "story one\nends");
	cr_assert_str_eq(text_of(d, 1), "story two");
	cr_assert_str_eq(text_of(d, 2), "three");
	/* The line where the text starts, after the stripped newline. */
	cr_assert_eq(nl_dataset_sample(d, 1)->line, 3);
	nl_dataset_free(d);

	/* Text without a single blank line (WikiText-2 raw): one paragraph per line. */
	p = fixture("noblank.txt", " = Title = \r\n line two \r\nline three\r\n");
	d = open_ds(p, NL_DS_TEXT, NULL, NULL);
	cr_assert_eq(nl_dataset_count(d), 3);
	cr_assert_str_eq(text_of(d, 1), "line two");
	nl_dataset_free(d);

	p = fixture("lines.txt", " = Title = \r\n line two \r\n\r\nline three");
	d = open_ds(p, NL_DS_LINES, NULL, NULL);
	cr_assert_eq(nl_dataset_count(d), 3);
	cr_assert_str_eq(text_of(d, 0), "= Title =");
	cr_assert_str_eq(text_of(d, 2), "line three");
	cr_assert_eq(nl_dataset_sample(d, 2)->line, 4);
	nl_dataset_free(d);
}

Test(dataset, jsonl_escapes_and_fields)
{
	const char *p = fixture("a.jsonl",
		"{\"question\": \"q\\\"1\\\\ \\/ \\t\\u00e9\\ud83d\\ude00\", \"answer\": \"a1\", \"n\": [1, {\"x\": null}]}\n"
		"\n"
		"  {\"answer\":\"a2\",\"question\":\"q2\\n\", \"extra\": -1.5e3}  \n");
	struct nl_dataset *d = open_ds(p, NL_DS_JSONL, "question,answer", NULL);

	cr_assert_eq(nl_dataset_count(d), 2);
	cr_assert_str_eq(text_of(d, 0), "q\"1\\ / \t\xc3\xa9\xf0\x9f\x98\x80\na1");
	/* Selection order is the --fields order, not the record order. */
	cr_assert_str_eq(text_of(d, 1), "q2\n\na2");
	cr_assert_eq(nl_dataset_sample(d, 1)->line, 3);
	nl_dataset_free(d);

	/* Without --fields: every non-empty string field in record order. */
	d = open_ds(p, NL_DS_JSONL, NULL, NULL);
	cr_assert_str_eq(text_of(d, 1), "a2\nq2");
	nl_dataset_free(d);
}

Test(dataset, json_array_alpaca)
{
	const char *p = fixture("alpaca.json",
		"[\n {\"instruction\": \"Do X.\", \"input\": \"\", \"output\": \"Done.\"},\n"
		" {\"instruction\": \"Translate\", \"input\": \"hola\", \"output\": \"hello\"}\n]\n");
	struct nl_dataset *d = open_ds(p, NL_DS_JSON, "instruction,input,output", NULL);

	cr_assert_eq(nl_dataset_count(d), 2);
	cr_assert_str_eq(text_of(d, 0), "Do X.\nDone.");
	cr_assert_str_eq(text_of(d, 1), "Translate\nhola\nhello");
	cr_assert_eq(nl_dataset_sample(d, 1)->line, 3);
	nl_dataset_free(d);
}

Test(dataset, json_rejects_name_line)
{
	const char *p;
	int err;

	p = fixture("bad1.jsonl", "{\"question\": \"a\", \"answer\": \"b\"}\n{\"question\": \"c\"}\n");
	err = open_ds_err(p, NL_DS_JSONL, "question,answer");
	cr_assert_eq(err, NL_E_MISSING);
	cr_assert(strstr(nl_diag_msg(), "line 2") && strstr(nl_diag_msg(), "'answer'") &&
		  strstr(nl_diag_msg(), "bad1.jsonl"), "%s", nl_diag_msg());

	p = fixture("bad2.jsonl", "{\"a\": \"x\"}\n{\"a\": \"y\"}\n{\"a\": \"z\" \"b\": 1}\n");
	cr_assert_eq(open_ds_err(p, NL_DS_JSONL, NULL), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "line 3 column 11"), "%s", nl_diag_msg());

	p = fixture("bad3.jsonl", "{\"a\": \"\\ud83d x\"}\n");
	cr_assert_eq(open_ds_err(p, NL_DS_JSONL, NULL), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "surrogate"), "%s", nl_diag_msg());

	p = fixture("bad4.jsonl", "{\"a\": \"unterminated}\n");
	cr_assert_eq(open_ds_err(p, NL_DS_JSONL, NULL), NL_E_FORMAT);

	p = fixture("bad5.jsonl", "{\"a\": \"x\"} {\"a\": \"y\"}\n");
	cr_assert_eq(open_ds_err(p, NL_DS_JSONL, NULL), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "one record per line"), "%s", nl_diag_msg());

	p = fixture("bad6.json", "[{\"a\": \"x\"},\n{\"a\": tru}]");
	cr_assert_eq(open_ds_err(p, NL_DS_JSON, NULL), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "line 2"), "%s", nl_diag_msg());

	p = fixture("bad7.json", "{\"a\": \"x\"}");
	cr_assert_eq(open_ds_err(p, NL_DS_JSON, NULL), NL_E_FORMAT);

	p = fixture("bad8.jsonl", "{\"a\": 3}\n");
	cr_assert_eq(open_ds_err(p, NL_DS_JSONL, "a"), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "not a string"), "%s", nl_diag_msg());

	/* Deep nesting is refused, not a stack overflow. */
	{
		char deep[400];
		size_t n = 0;

		n += (size_t)sprintf(deep, "{\"a\": ");
		for (int i = 0; i < 100; i++)
			deep[n++] = '[';
		deep[n] = 0;
		p = fixture("bad9.jsonl", deep);
		cr_assert_eq(open_ds_err(p, NL_DS_JSONL, NULL), NL_E_FORMAT);
	}
	cr_assert_eq(open_ds_err("/nonexistent/x.jsonl", NL_DS_JSONL, NULL), -ENOENT);
	p = fixture("empty.txt", "\n \n");
	cr_assert_eq(open_ds_err(p, NL_DS_TEXT, NULL), NL_E_FORMAT);
}

static const char hellaswag_text[] =
	"Roof shingle removal: A man is sitting on a roof. he\n"
	"3\n"
	"is using wrap to wrap a pair of skis.\n"
	"is ripping level tiles off.\n"
	"is holding a rubik's cube.\n"
	"starts pulling up roofing on a roof.\n"
	"Clean and jerk: A lady walks to a barbell. the lady \n"
	"0\n"
	" swings and lands in her arms.\n"
	"pulls the barbell forward.\n"
	"pulls a rope attached to the barbell.\n"
	"stands and lifts the weight over her head.\n";

Test(dataset, hellaswag)
{
	const char *p = fixture("hs.txt", hellaswag_text);
	struct nl_dataset *d = open_ds(p, NL_DS_HELLASWAG, NULL, NULL);
	char bad[sizeof(hellaswag_text)];

	cr_assert_eq(nl_dataset_count(d), 2);
	cr_assert_str_eq(text_of(d, 0), "Roof shingle removal: A man is sitting on a roof. he starts pulling up roofing on a roof.");
	cr_assert_str_eq(text_of(d, 1), "Clean and jerk: A lady walks to a barbell. the lady swings and lands in her arms.");
	cr_assert_eq(nl_dataset_sample(d, 1)->line, 7);
	nl_dataset_free(d);

	memcpy(bad, hellaswag_text, sizeof(bad));
	*strstr(bad, "\n0\n") = 0;
	strcat(bad, "\n7\na\nb\nc\nd\n");
	p = fixture("hs_bad.txt", bad);
	cr_assert_eq(open_ds_err(p, NL_DS_HELLASWAG, NULL), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "line 8") && strstr(nl_diag_msg(), "'7'"), "%s", nl_diag_msg());

	p = fixture("hs_trunc.txt", "ctx\n1\na\nb\n");
	cr_assert_eq(open_ds_err(p, NL_DS_HELLASWAG, NULL), NL_E_TRUNCATED);
	cr_assert(strstr(nl_diag_msg(), "line 1"), "%s", nl_diag_msg());
}

Test(dataset, hellaswag_bz2)
{
	char path[512], cmd[1200];
	struct nl_dataset *d;

	if (system("bzip2 --help >/dev/null 2>&1") != 0)
		cr_skip_test("bzip2 is not installed (make deps installs it)");
	tmp_path(path, sizeof(path), "hsz.txt");
	write_file(path, hellaswag_text, strlen(hellaswag_text));
	snprintf(cmd, sizeof(cmd), "bzip2 -kf '%s'", path);
	cr_assert_eq(system(cmd), 0);
	strcat(path, ".bz2");
	d = open_ds(path, NL_DS_HELLASWAG, NULL, NULL);
	cr_assert_eq(nl_dataset_count(d), 2);
	nl_dataset_free(d);
	/* Not bzip2 data: the failure is reported, not an empty dataset. */
	tmp_path(path, sizeof(path), "fake.txt.bz2");
	write_file(path, "plain", 5);
	cr_assert_eq(open_ds_err(path, NL_DS_HELLASWAG, NULL), NL_E_COMPRESS);
	/* NUL bytes are refused after decompression as in a plain file. */
	tmp_path(path, sizeof(path), "nul.txt");
	write_file(path, "one\n\0two\n", 9);
	snprintf(cmd, sizeof(cmd), "bzip2 -kf '%s'", path);
	cr_assert_eq(system(cmd), 0);
	cr_assert_eq(open_ds_err(path, NL_DS_LINES, NULL), NL_E_FORMAT);
	strcat(path, ".bz2");
	cr_assert_eq(open_ds_err(path, NL_DS_LINES, NULL), NL_E_FORMAT);
}

Test(dataset, ids)
{
	const char *p = fixture("t.ids", "1 2 3\n\n  4\t5 \r\n");
	struct nl_dataset *d = open_ds(p, NL_DS_IDS, NULL, NULL);
	const struct nl_sample *s;

	cr_assert_eq(nl_dataset_count(d), 2);
	s = nl_dataset_sample(d, 1);
	cr_assert_eq(s->n_ids, 2);
	cr_assert_eq(s->ids[0], 4);
	cr_assert_eq(s->ids[1], 5);
	cr_assert_eq(s->line, 3);
	cr_assert_null(s->text);
	nl_dataset_free(d);

	p = fixture("bad.ids", "1 2\n3 x4 5\n");
	cr_assert_eq(open_ds_err(p, NL_DS_IDS, NULL), NL_E_FORMAT);
	cr_assert(strstr(nl_diag_msg(), "line 2 column 3") && strstr(nl_diag_msg(), "'x4'"), "%s", nl_diag_msg());
	p = fixture("big.ids", "99999999999\n");
	cr_assert_eq(open_ds_err(p, NL_DS_IDS, NULL), NL_E_FORMAT);
}

static struct nl_dataset *numbered_dataset(size_t n)
{
	char path[512];
	FILE *f;
	struct nl_dataset *d;

	tmp_path(path, sizeof(path), "numbered.txt");
	f = fopen(path, "w");
	cr_assert_not_null(f);
	for (size_t i = 0; i < n; i++)
		fprintf(f, "sample %zu\n", i);
	fclose(f);
	d = open_ds(path, NL_DS_LINES, NULL, NULL);
	cr_assert_eq(nl_dataset_count(d), n);
	return d;
}

Test(dataset, selection_deterministic_and_split_disjoint)
{
	struct nl_dataset *d = numbered_dataset(1000);
	struct nl_select_opts o = { .n_samples = 100, .seed = 7, .role = NL_SPLIT_TRAIN, .test_fraction = 0.2 };
	uint32_t *a, *b, *train, *test;
	size_t na, nb, ntrain, ntest;
	bool seen[1000] = { 0 };

	cr_assert_eq(nl_dataset_select(d, &o, &a, &na), 0);
	cr_assert_eq(nl_dataset_select(d, &o, &b, &nb), 0);
	cr_assert_eq(na, 100);
	cr_assert_eq(nb, 100);
	cr_assert_eq(memcmp(a, b, na * sizeof(*a)), 0, "same seed, same selection");
	for (size_t i = 1; i < na; i++)
		cr_assert_lt(a[i - 1], a[i], "increasing order");
	free(b);
	o.seed = 8;
	cr_assert_eq(nl_dataset_select(d, &o, &b, &nb), 0);
	cr_assert_neq(memcmp(a, b, na * sizeof(*a)), 0, "another seed, another selection");
	free(a);
	free(b);

	/* All of train and all of test: disjoint, together everything. */
	o.n_samples = 0;
	cr_assert_eq(nl_dataset_select(d, &o, &train, &ntrain), 0);
	o.role = NL_SPLIT_TEST;
	o.seed = 99;
	cr_assert_eq(nl_dataset_select(d, &o, &test, &ntest), 0);
	cr_assert_eq(ntrain + ntest, 1000);
	cr_assert(ntest > 150 && ntest < 250, "test share %zu of 1000 for fraction 0.2", ntest);
	for (size_t i = 0; i < ntrain; i++)
		seen[train[i]] = true;
	for (size_t i = 0; i < ntest; i++) {
		cr_assert(!seen[test[i]], "sample %u in both roles", test[i]);
		seen[test[i]] = true;
		cr_assert(nl_dataset_is_test(test[i], 0.2));
	}
	/* Any seed, any count: a train selection never touches the test role. */
	o.role = NL_SPLIT_TRAIN;
	for (uint64_t seed = 0; seed < 5; seed++) {
		o.seed = seed;
		o.n_samples = 50 + seed * 100;
		cr_assert_eq(nl_dataset_select(d, &o, &a, &na), 0);
		for (size_t i = 0; i < na; i++)
			cr_assert(!nl_dataset_is_test(a[i], 0.2));
		free(a);
	}
	o.role = NL_SPLIT_ALL;
	o.n_samples = 5000;
	cr_assert_eq(nl_dataset_select(d, &o, &a, &na), 0);
	cr_assert_eq(na, 1000);
	free(a);
	free(train);
	free(test);
	nl_dataset_free(d);
}

Test(dataset, real_datasets)
{
	const char *dd = data_dir();
	char path[1024];
	struct nl_dataset *d;

	if (!dd)
		cr_skip_test("NL_DATA_DIR with the real data is not set");
	snprintf(path, sizeof(path), "%s/text/gsm8k/train.jsonl", dd);
	d = open_ds(path, NL_DS_JSONL, "question,answer", NULL);
	cr_assert_eq(nl_dataset_count(d), 7473);
	cr_assert(strstr(text_of(d, 0), "Natalia sold clips"));
	nl_dataset_free(d);
	snprintf(path, sizeof(path), "%s/text/alpaca/alpaca_data_1k.json", dd);
	d = open_ds(path, NL_DS_JSON, "instruction,input,output", NULL);
	cr_assert_eq(nl_dataset_count(d), 1000);
	nl_dataset_free(d);
	snprintf(path, sizeof(path), "%s/text/tinystories/tinystories_sample_cs336.txt", dd);
	d = open_ds(path, NL_DS_TEXT, NULL, "<|endoftext|>");
	cr_assert_eq(nl_dataset_count(d), 5);
	nl_dataset_free(d);
}

/* ---- .npy import ---- */

/* Writes a .npy file; descr like "<f4"; version 1 or 2. */
static void write_npy(const char *path, int version, const char *descr, bool fortran, const char *shape,
		      const void *data, size_t data_len)
{
	char dict[256], hdr[512];
	size_t pre = version == 1 ? 10 : 12, dlen, total;
	FILE *f;

	snprintf(dict, sizeof(dict), "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }", descr,
		 fortran ? "True" : "False", shape);
	dlen = strlen(dict);
	total = (pre + dlen + 1 + 63) / 64 * 64;
	memset(hdr, ' ', sizeof(hdr));
	memcpy(hdr, "\x93NUMPY", 6);
	hdr[6] = (char)version;
	hdr[7] = 0;
	if (version == 1) {
		hdr[8] = (char)((total - pre) & 0xff);
		hdr[9] = (char)((total - pre) >> 8);
	} else {
		hdr[8] = (char)((total - pre) & 0xff);
		hdr[9] = (char)((total - pre) >> 8);
		hdr[10] = 0;
		hdr[11] = 0;
	}
	memcpy(hdr + pre, dict, dlen);
	hdr[total - 1] = '\n';
	f = fopen(path, "wb");
	cr_assert_not_null(f);
	fwrite(hdr, 1, total, f);
	if (data_len)
		fwrite(data, 1, data_len, f);
	fclose(f);
}

static uint16_t float_to_half(float x)
{
	/* Exact for the small values used here (integers / 8 below 2048). */
	uint32_t bits;
	int exp;
	uint32_t sign, mant;

	memcpy(&bits, &x, 4);
	sign = (bits >> 16) & 0x8000;
	if ((bits & 0x7fffffff) == 0)
		return (uint16_t)sign;
	exp = (int)((bits >> 23) & 0xff) - 127 + 15;
	mant = (bits >> 13) & 0x3ff;
	return (uint16_t)(sign | (uint32_t)exp << 10 | mant);
}

enum { NPY_T = 37, NPY_N = 53 };

static void check_csr_vs(const struct nl_csr *c, const float *vals, double thr)
{
	cr_assert_eq(c->n_tokens, NPY_T);
	cr_assert_eq(c->n_neurons, NPY_N);
	cr_assert_eq(nl_csr_validate(c, "npy"), 0, "%s", nl_diag_msg());
	for (int t = 0; t < NPY_T; t++) {
		uint64_t k = c->indptr[t];

		for (int i = 0; i < NPY_N; i++) {
			if (fabs(vals[t * NPY_N + i]) > thr) {
				cr_assert_lt(k, c->indptr[t + 1]);
				cr_assert_eq(c->indices[k], (uint32_t)i, "token %d", t);
				k++;
			}
		}
		cr_assert_eq(k, c->indptr[t + 1], "token %d", t);
	}
}

Test(import, npy_round_trip_each_dtype)
{
	static float vals[NPY_T * NPY_N];
	static uint8_t u8[NPY_T * NPY_N];
	static uint16_t f16[NPY_T * NPY_N];
	uint32_t seed = 99;
	char path[512], shape[64];
	struct nl_csr c;
	struct nl_npy_info info;

	for (int i = 0; i < NPY_T * NPY_N; i++) {
		seed = seed * 1664525u + 1013904223u;
		vals[i] = (float)((int)(seed >> 20) % 33 - 16) / 8.0f;
		u8[i] = fabsf(vals[i]) > 0.7f ? (uint8_t)(1 + (seed & 7)) : 0;
		f16[i] = float_to_half(vals[i]);
	}
	snprintf(shape, sizeof(shape), "(%d, %d)", NPY_T, NPY_N);

	tmp_path(path, sizeof(path), "f32.npy");
	write_npy(path, 1, "<f4", false, shape, vals, sizeof(vals));
	cr_assert_eq(nl_npy_read_active(path, 0.5, &c, &info), 0, "%s", nl_diag_msg());
	cr_assert_eq(info.dtype, NL_NPY_F32);
	check_csr_vs(&c, vals, 0.5);
	nl_csr_free(&c);

	tmp_path(path, sizeof(path), "f16.npy");
	write_npy(path, 2, "<f2", false, shape, f16, sizeof(f16));
	cr_assert_eq(nl_npy_read_active(path, 1.0, &c, &info), 0, "%s", nl_diag_msg());
	cr_assert_eq(info.major, 2);
	check_csr_vs(&c, vals, 1.0);
	nl_csr_free(&c);

	{
		static float mask_as_float[NPY_T * NPY_N];

		for (int i = 0; i < NPY_T * NPY_N; i++)
			mask_as_float[i] = u8[i] ? 1.0f : 0.0f;
		tmp_path(path, sizeof(path), "u8.npy");
		write_npy(path, 1, "|u1", false, shape, u8, sizeof(u8));
		cr_assert_eq(nl_npy_read_active(path, 123.0, &c, &info), 0, "%s", nl_diag_msg());
		check_csr_vs(&c, mask_as_float, 0.5);
		nl_csr_free(&c);
		for (int i = 0; i < NPY_T * NPY_N; i++)
			u8[i] = u8[i] ? 1 : 0;
		tmp_path(path, sizeof(path), "b1.npy");
		write_npy(path, 1, "|b1", false, shape, u8, sizeof(u8));
		cr_assert_eq(nl_npy_read_active(path, 0, &c, &info), 0, "%s", nl_diag_msg());
		cr_assert_eq(info.dtype, NL_NPY_BOOL);
		check_csr_vs(&c, mask_as_float, 0.5);
		nl_csr_free(&c);
	}
}

Test(import, npy_rejects)
{
	static float vals[12];
	char path[512];
	struct nl_csr c;
	struct nl_npy_info info;

	tmp_path(path, sizeof(path), "r_fortran.npy");
	write_npy(path, 1, "<f4", true, "(3, 4)", vals, sizeof(vals));
	cr_assert_eq(nl_npy_read_active(path, 0, &c, &info), NL_E_UNSUPPORTED);
	cr_assert(strstr(nl_diag_msg(), "fortran_order") && strstr(nl_diag_msg(), "r_fortran.npy"), "%s", nl_diag_msg());

	tmp_path(path, sizeof(path), "r_3d.npy");
	write_npy(path, 1, "<f4", false, "(3, 2, 2)", vals, sizeof(vals));
	cr_assert_eq(nl_npy_read_header(path, &info), NL_E_SHAPE);
	cr_assert(strstr(nl_diag_msg(), "3 dimensions"), "%s", nl_diag_msg());

	tmp_path(path, sizeof(path), "r_f8.npy");
	write_npy(path, 1, "<f8", false, "(3, 2)", vals, sizeof(vals));
	cr_assert_eq(nl_npy_read_header(path, &info), NL_E_TYPE);
	cr_assert(strstr(nl_diag_msg(), "'<f8'"), "%s", nl_diag_msg());

	tmp_path(path, sizeof(path), "r_big_endian.npy");
	write_npy(path, 1, ">f4", false, "(3, 4)", vals, sizeof(vals));
	cr_assert_eq(nl_npy_read_header(path, &info), NL_E_TYPE);

	tmp_path(path, sizeof(path), "r_trunc.npy");
	write_npy(path, 1, "<f4", false, "(3, 4)", vals, sizeof(vals) - 4);
	cr_assert_eq(nl_npy_read_header(path, &info), NL_E_TRUNCATED);
	cr_assert(strstr(nl_diag_msg(), "expected"), "%s", nl_diag_msg());

	tmp_path(path, sizeof(path), "r_trailing.npy");
	write_npy(path, 1, "<f4", false, "(2, 4)", vals, sizeof(vals));
	cr_assert_eq(nl_npy_read_header(path, &info), NL_E_FORMAT);

	tmp_path(path, sizeof(path), "r_magic.npy");
	{
		static const char zip[] = "PK\x03\x04 not a npy file at all";

		write_file(path, zip, sizeof(zip) - 1);
	}
	cr_assert_eq(nl_npy_read_header(path, &info), NL_E_MAGIC);

	tmp_path(path, sizeof(path), "r_version.npy");
	write_npy(path, 1, "<f4", false, "(3, 4)", vals, sizeof(vals));
	{
		FILE *f = fopen(path, "r+b");

		fseek(f, 6, SEEK_SET);
		fputc(4, f);
		fclose(f);
	}
	cr_assert_eq(nl_npy_read_header(path, &info), NL_E_VERSION);

	tmp_path(path, sizeof(path), "r_short.npy");
	write_file(path, "\x93NUM", 4);
	cr_assert_eq(nl_npy_read_header(path, &info), NL_E_TRUNCATED);
	cr_assert_eq(nl_npy_read_header("/nonexistent.npy", &info), -ENOENT);
}

Test(import, npy_to_trace_round_trip)
{
	static uint8_t m0[6 * 5] = { 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 0, 1, 0, 1, 0, 0, 0, 0, 0, 1, 1, 0, 0, 0, 0 };
	static uint8_t m1[6 * 5] = { 0, 1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 1, 0, 1, 1, 0, 0, 0, 0, 0, 0, 1 };
	char p0[512], p1[512], p2[512], out[512];
	const char *paths[2] = { p0, p1 };
	struct nl_trace_meta meta = { 0 };
	struct nl_h5_opts h5 = { .compress = NL_COMPRESS_DEFLATE };
	struct nl_trace_reader *r;
	struct nl_csr c;
	double density[2];

	tmp_path(p0, sizeof(p0), "L0.npy");
	tmp_path(p1, sizeof(p1), "L1.npy");
	tmp_path(p2, sizeof(p2), "L2.npy");
	tmp_path(out, sizeof(out), "imported.h5");
	write_npy(p0, 1, "|b1", false, "(6, 5)", m0, sizeof(m0));
	write_npy(p1, 3, "|u1", false, "(6, 5)", m1, sizeof(m1));
	snprintf(meta.model.name, sizeof(meta.model.name), "tiny");
	snprintf(meta.dataset, sizeof(meta.dataset), "test");
	unlink(out);
	cr_assert_eq(nl_npy_import(paths, 2, 0, NULL, &meta, &h5, out, density), NL_E_INVAL, "d_model is required");
	meta.model.d_model = 8;
	meta.model.n_layers = 3;
	cr_assert_eq(nl_npy_import(paths, 2, 0, NULL, &meta, &h5, out, density), NL_E_MISMATCH, "3 layers vs 2 files");
	meta.model.n_layers = 0;
	cr_assert_eq(nl_npy_import(paths, 2, 0, NULL, &meta, &h5, out, density), 0, "%s", nl_diag_msg());
	cr_assert_float_eq(density[0], 11.0 / 30, 1e-12);
	cr_assert_float_eq(density[1], 7.0 / 30, 1e-12);
	cr_assert_eq(nl_trace_open(&r, out), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_trace_get_meta(r)->model.n_layers, 2);
	cr_assert_eq(nl_trace_get_meta(r)->model.n_neurons, 5);
	cr_assert_eq(nl_trace_get_meta(r)->n_tokens, 6);
	cr_assert_eq(nl_trace_get_meta(r)->sparsity, NL_SPARSITY_IMPORTED);
	cr_assert_eq(nl_trace_read_layer(r, 1, &c), 0, "%s", nl_diag_msg());
	cr_assert_eq(c.indptr[6], 7);
	cr_assert_eq(c.indptr[3], 2, "row 2 of layer 1 is empty");
	cr_assert_eq(c.indices[0], 1);
	cr_assert_eq(c.indices[6], 4);
	nl_csr_free(&c);
	nl_trace_close(r);

	/* With per-token sample ids (int64), read back as written. */
	{
		static const int64_t sid[6] = { 3, 3, 3, 9, 9, 4000000000ll };
		static const int32_t sid_bad[6] = { 0, 1, 2, 3, 4, -5 };
		char ids_path[512];
		uint32_t *got = NULL;

		tmp_path(ids_path, sizeof(ids_path), "sid.npy");
		write_npy(ids_path, 1, "<i8", false, "(6,)", sid, sizeof(sid));
		unlink(out);
		cr_assert_eq(nl_npy_import(paths, 2, 0, ids_path, &meta, &h5, out, NULL), 0, "%s", nl_diag_msg());
		cr_assert_eq(nl_trace_open(&r, out), 0, "%s", nl_diag_msg());
		cr_assert(nl_trace_get_meta(r)->has_sample_ids);
		cr_assert_eq(nl_trace_read_sample_ids(r, &got), 0, "%s", nl_diag_msg());
		cr_assert_eq(got[2], 3);
		cr_assert_eq(got[5], 4000000000u);
		free(got);
		nl_trace_close(r);

		write_npy(ids_path, 1, "<i4", false, "(6,)", sid_bad, sizeof(sid_bad));
		unlink(out);
		cr_assert_eq(nl_npy_import(paths, 2, 0, ids_path, &meta, &h5, out, NULL), NL_E_FORMAT);
		cr_assert(strstr(nl_diag_msg(), "-5") && strstr(nl_diag_msg(), "token 5"), "%s", nl_diag_msg());
		write_npy(ids_path, 1, "<i4", false, "(5,)", sid_bad, 20);
		cr_assert_eq(nl_npy_import(paths, 2, 0, ids_path, &meta, &h5, out, NULL), NL_E_MISMATCH);
		write_npy(ids_path, 1, "<i4", false, "(3, 2)", sid_bad, sizeof(sid_bad));
		cr_assert_eq(nl_npy_import(paths, 2, 0, ids_path, &meta, &h5, out, NULL), NL_E_SHAPE);
		/* A 1-D array is not a layer, an integer array is not a mask. */
		cr_assert_eq(nl_npy_read_active(ids_path, 0, &c, NULL), NL_E_TYPE);
		write_npy(ids_path, 1, "|u1", false, "(6,)", m0, 6);
		cr_assert_eq(nl_npy_read_active(ids_path, 0, &c, NULL), NL_E_SHAPE);
		cr_assert_neq(access(out, F_OK), 0);
	}

	/* Layers that disagree on the shape are refused before anything is written. */
	write_npy(p2, 1, "|u1", false, "(5, 6)", m1, sizeof(m1));
	paths[1] = p2;
	unlink(out);
	cr_assert_eq(nl_npy_import(paths, 2, 0, NULL, &meta, &h5, out, NULL), NL_E_MISMATCH);
	cr_assert(strstr(nl_diag_msg(), "L2.npy"), "%s", nl_diag_msg());
	cr_assert_neq(access(out, F_OK), 0);
}

/* ---- synthetic generator ---- */

static void synth_small(struct nl_synth_params *p)
{
	nl_synth_defaults(p);
	cr_assert_eq(nl_synth_shape(&p->model, "3x2048"), 0);
	p->n_tokens = 3000;
	p->density = 0.05;
	p->seed = 42;
}

static bool csr_equal(const struct nl_csr *a, const struct nl_csr *b)
{
	return a->n_tokens == b->n_tokens && a->n_neurons == b->n_neurons &&
	       !memcmp(a->indptr, b->indptr, (a->n_tokens + 1) * sizeof(*a->indptr)) &&
	       !memcmp(a->indices, b->indices, a->indptr[a->n_tokens] * sizeof(*a->indices));
}

Test(synth, deterministic_and_seeded)
{
	struct nl_synth_params p;
	struct nl_csr a, b, c;

	synth_small(&p);
	cr_assert_eq(nl_synth_layer(&p, 2, &a), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_synth_layer(&p, 0, &c), 0);
	nl_csr_free(&c);
	cr_assert_eq(nl_synth_layer(&p, 2, &b), 0);
	cr_assert(csr_equal(&a, &b), "same (seed, layer), same layer whatever ran before");
	nl_csr_free(&b);
	cr_assert_eq(nl_synth_layer(&p, 1, &b), 0);
	cr_assert(!csr_equal(&a, &b), "layers differ");
	nl_csr_free(&b);
	p.seed = 43;
	cr_assert_eq(nl_synth_layer(&p, 2, &b), 0);
	cr_assert(!csr_equal(&a, &b), "seeds differ");
	nl_csr_free(&b);
	/* A prefix of the tokens does not depend on how many tokens follow. */
	p.seed = 42;
	p.n_tokens = 1500;
	cr_assert_eq(nl_synth_layer(&p, 2, &b), 0);
	cr_assert_eq(memcmp(a.indptr, b.indptr, 1501 * sizeof(*a.indptr)), 0);
	nl_csr_free(&b);
	nl_csr_free(&a);
}

Test(synth, density_shape_and_skew)
{
	struct nl_synth_params p;
	struct nl_csr a;
	uint64_t *freq;
	double dens;
	uint64_t top = 0, below = 0;

	synth_small(&p);
	for (int k = 0; k < 3; k++) {
		double want = k == 0 ? 0.01 : k == 1 ? 0.05 : 0.3;

		p.density = want;
		p.zipf_s = 1.0;
		cr_assert_eq(nl_synth_layer(&p, 0, &a), 0, "%s", nl_diag_msg());
		cr_assert_eq(nl_csr_validate(&a, "synthetic"), 0, "%s", nl_diag_msg());
		dens = (double)a.indptr[a.n_tokens] / ((double)a.n_tokens * a.n_neurons);
		cr_assert(fabs(dens - want) < 0.05 * want, "density %g for target %g", dens, want);
		if (k == 1) {
			/* Power law: the hottest 5% of neurons hold far more than 5% of activations. */
			freq = calloc(a.n_neurons, sizeof(*freq));
			for (uint64_t i = 0; i < a.indptr[a.n_tokens]; i++)
				freq[a.indices[i]]++;
			for (uint32_t i = 0; i < a.n_neurons; i++) {
				uint32_t rank = 0;

				/* Count how many neurons are hotter (n = 2048: fine for a test). */
				for (uint32_t j = 0; j < a.n_neurons; j++)
					rank += freq[j] > freq[i];
				if (rank < a.n_neurons / 20)
					top += freq[i];
				else
					below += freq[i];
			}
			cr_assert(top > (top + below) / 4, "top 5%% hold %llu of %llu", (unsigned long long)top,
				  (unsigned long long)(top + below));
			/* Scattered: the hot neurons are not the low ids. */
			{
				uint64_t first = 0;

				for (uint32_t i = 0; i < a.n_neurons / 20; i++)
					first += freq[i];
				cr_assert(first < top / 2, "hot neurons are scattered over the ids");
			}
			free(freq);
		}
		nl_csr_free(&a);
	}
}

/*
 * Mean over 20 neurons of middling frequency (ranks 500..519) of the phi
 * coefficient (correlation of the 0/1 activations) with their most correlated
 * partner.
 */
static double middling_best_phi(const struct nl_csr *a)
{
	uint32_t n = a->n_neurons;
	uint64_t *freq = calloc(n, sizeof(*freq)), *rank_freq = calloc(n, sizeof(*rank_freq));
	uint32_t *pair = calloc(n, sizeof(*pair)), best[20];
	double T = (double)a->n_tokens, sum = 0;

	for (uint64_t i = 0; i < a->indptr[a->n_tokens]; i++)
		freq[a->indices[i]]++;
	memcpy(rank_freq, freq, n * sizeof(*freq));
	for (int k = 0; k < 520; k++) {
		uint32_t arg = 0;

		for (uint32_t i = 1; i < n; i++)
			if (rank_freq[i] > rank_freq[arg])
				arg = i;
		if (k >= 500)
			best[k - 500] = arg;
		rank_freq[arg] = 0;
	}
	for (int k = 0; k < 20; k++) {
		uint32_t i0 = best[k];
		double pi = freq[i0] / T, top = 0;

		memset(pair, 0, n * sizeof(*pair));
		for (uint64_t t = 0; t < a->n_tokens; t++) {
			bool has = false;

			for (uint64_t x = a->indptr[t]; x < a->indptr[t + 1]; x++)
				has |= a->indices[x] == i0;
			if (!has)
				continue;
			for (uint64_t x = a->indptr[t]; x < a->indptr[t + 1]; x++)
				pair[a->indices[x]]++;
		}
		for (uint32_t j = 0; j < n; j++) {
			double pj = freq[j] / T, den = pi * (1 - pi) * pj * (1 - pj), phi;

			if (j == i0 || den <= 0)
				continue;
			phi = (pair[j] / T - pi * pj) / sqrt(den);
			if (phi > top)
				top = phi;
		}
		sum += top;
	}
	free(freq);
	free(rank_freq);
	free(pair);
	return sum / 20;
}

Test(synth, groups_coactivate)
{
	struct nl_synth_params p;
	struct nl_csr a;
	double grouped, independent;

	/*
	 * The groups are the structure placement exploits: their members are far
	 * more correlated than in the same generator without groups (noise 1).
	 */
	synth_small(&p);
	cr_assert_eq(nl_synth_layer(&p, 1, &a), 0);
	grouped = middling_best_phi(&a);
	nl_csr_free(&a);
	p.noise = 1;
	cr_assert_eq(nl_synth_layer(&p, 1, &a), 0);
	independent = middling_best_phi(&a);
	nl_csr_free(&a);
	cr_assert(grouped > 0.15 && grouped > 2.5 * independent,
		  "best-partner phi %g with groups, %g without", grouped, independent);
}

Test(synth, rejects_bad_params)
{
	struct nl_synth_params p;
	struct nl_csr a;
	struct nl_model_id id;

	synth_small(&p);
	p.density = 0;
	cr_assert_eq(nl_synth_layer(&p, 0, &a), NL_E_INVAL);
	synth_small(&p);
	cr_assert_eq(nl_synth_layer(&p, 3, &a), NL_E_INVAL);
	synth_small(&p);
	p.coherence = 0;
	cr_assert_eq(nl_synth_layer(&p, 0, &a), NL_E_INVAL);
	synth_small(&p);
	p.noise = 0;
	p.density = 0.9;
	cr_assert_eq(nl_synth_layer(&p, 0, &a), NL_E_INVAL);
	synth_small(&p);
	p.group_size = 0;
	cr_assert_eq(nl_synth_layer(&p, 0, &a), NL_E_INVAL);

	cr_assert_eq(nl_synth_shape(&id, "opt-6.7b"), 0);
	cr_assert_eq(id.n_layers, 32);
	cr_assert_eq(id.n_neurons, 16384);
	cr_assert_eq(id.d_model, 4096);
	cr_assert_str_eq(id.name, "synthetic-opt-6.7b");
	cr_assert_eq(nl_synth_shape(&id, "Llama-2-7B"), 0);
	cr_assert_eq(id.n_neurons, 11008);
	cr_assert_eq(nl_synth_shape(&id, "4x100x32"), 0);
	cr_assert_eq(id.d_model, 32);
	cr_assert_str_eq(id.name, "synthetic-4x100");
	cr_assert_eq(nl_synth_shape(&id, "4x"), NL_E_INVAL);
	cr_assert_eq(nl_synth_shape(&id, "gpt-5"), NL_E_INVAL);
	cr_assert_eq(nl_synth_shape(&id, "0x10"), NL_E_INVAL);
}

/* ---- the program ---- */

Test(cli, help_version_usage_errors)
{
	char out[8192], err[8192];

	cr_assert_eq(run_cmd("--help", out, sizeof(out), err, sizeof(err)), 0);
	cr_assert(strstr(out, "Usage: nl-profile run"), "%s", out);
	cr_assert_eq(run_cmd("run --help", out, sizeof(out), NULL, 0), 0);
	cr_assert(strstr(out, "--sparsity"));
	cr_assert_eq(run_cmd("import -h", out, sizeof(out), NULL, 0), 0);
	cr_assert_eq(run_cmd("synth --help", out, sizeof(out), NULL, 0), 0);
	cr_assert_eq(run_cmd("--version", out, sizeof(out), NULL, 0), 0);
	cr_assert(strstr(out, "nl-profile (neuralink)"), "%s", out);
	cr_assert_eq(run_cmd("", NULL, 0, err, sizeof(err)), 2);
	cr_assert_eq(run_cmd("frobnicate", NULL, 0, err, sizeof(err)), 2);
	cr_assert(strstr(err, "unknown command 'frobnicate'"), "%s", err);
	cr_assert_eq(run_cmd("run --no-such-flag", NULL, 0, err, sizeof(err)), 2);
	cr_assert_eq(run_cmd("run -m x -d y", NULL, 0, err, sizeof(err)), 2);
	cr_assert(strstr(err, "-o/--output is required"), "%s", err);
	cr_assert_eq(run_cmd("run -m x -d y -o z --density 2", NULL, 0, err, sizeof(err)), 2);
	cr_assert_eq(run_cmd("run -m x -d y -o z --sparsity magic", NULL, 0, err, sizeof(err)), 2);
	cr_assert_eq(run_cmd("run -m x -d y -o z --split ''", NULL, 0, err, sizeof(err)), 2);
	cr_assert(strstr(err, "--split"), "%s", err);
	cr_assert_eq(run_cmd("synth --shape 2x10 --tokens 5 --density 3 -o z", NULL, 0, err, sizeof(err)), 2);
	cr_assert(strstr(err, "density"), "%s", err);
	cr_assert_eq(run_cmd("import -o z", NULL, 0, err, sizeof(err)), 2);
	/* d_model is u32: 2^32 must not wrap to 0 (or 2^32 + 5 to 5) */
	cr_assert_eq(run_cmd("import -o z --d-model 4294967296 a.npy", NULL, 0, err, sizeof(err)), 2);
	cr_assert(strstr(err, "--d-model"), "%s", err);
}

Test(cli, missing_file_and_no_overwrite)
{
	char err[8192], out_path[512], args[1200];

	tmp_path(out_path, sizeof(out_path), "never.h5");
	snprintf(args, sizeof(args), "run -m /nonexistent/model.bin -d /nonexistent/d.txt -o %s", out_path);
	cr_assert_eq(run_cmd(args, NULL, 0, err, sizeof(err)), 1);
	cr_assert(strstr(err, "/nonexistent/model.bin"), "%s", err);
	cr_assert_neq(access(out_path, F_OK), 0);

	tmp_path(out_path, sizeof(out_path), "exists.h5");
	write_file(out_path, "keep", 4);
	snprintf(args, sizeof(args), "synth --shape 2x64 --tokens 10 -o %s", out_path);
	cr_assert_eq(run_cmd(args, NULL, 0, err, sizeof(err)), 1);
	cr_assert(strstr(err, "exists") && strstr(err, "-f"), "%s", err);
	{
		char buf[8] = { 0 };
		FILE *f = fopen(out_path, "r");

		cr_assert_eq(fread(buf, 1, 4, f), 4);
		fclose(f);
		cr_assert_str_eq(buf, "keep");
	}
	snprintf(args, sizeof(args), "synth --shape 2x64 --tokens 10 --density 0.1 -q -f -o %s", out_path);
	cr_assert_eq(run_cmd(args, NULL, 0, err, sizeof(err)), 0, "%s", err);

	snprintf(args, sizeof(args), "import --d-model 8 --layers '%s/none_%%d.npy' -o %s/imp.h5", tmpdir, tmpdir);
	cr_assert_eq(run_cmd(args, NULL, 0, err, sizeof(err)), 1);
	cr_assert(strstr(err, "none_0.npy"), "%s", err);
}

Test(cli, synth_then_read_back)
{
	char out[8192], err[8192], path[512], args[1200];
	struct nl_trace_reader *r;
	struct nl_synth_params p;
	struct nl_csr a, b;

	tmp_path(path, sizeof(path), "synth.h5");
	snprintf(args, sizeof(args), "synth --shape 3x256 --tokens 500 --density 0.1 --seed 5 -j 2 -q -f --json -o %s", path);
	cr_assert_eq(run_cmd(args, out, sizeof(out), err, sizeof(err)), 0, "%s", err);
	cr_assert(strstr(out, "\"model\":\"synthetic-3x256\""), "%s", out);
	cr_assert_eq(nl_trace_open(&r, path), 0, "%s", nl_diag_msg());
	cr_assert_str_eq(nl_trace_get_meta(r)->model.name, "synthetic-3x256");
	cr_assert(strstr(nl_trace_get_meta(r)->dataset, "synthetic"));
	nl_synth_defaults(&p);
	nl_synth_shape(&p.model, "3x256");
	p.n_tokens = 500;
	p.density = 0.1;
	p.seed = 5;
	cr_assert_eq(nl_trace_read_layer(r, 2, &a), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_synth_layer(&p, 2, &b), 0);
	cr_assert(csr_equal(&a, &b), "the program writes what the library generates");
	nl_csr_free(&a);
	nl_csr_free(&b);
	nl_trace_close(r);
}

/* End to end on the real model: traces for GSM8K, WikiText-2 and Alpaca samples. */
static void profile_and_check(const char *model, const char *tok, const char *dataset, const char *extra,
			      const char *name, uint32_t threads, struct nl_csr *layer0)
{
	const char *dd = data_dir();
	char out[16384], err[8192], path[512], args[4096];
	struct nl_trace_reader *r;
	const struct nl_trace_meta *m;
	uint32_t *sid = NULL;

	tmp_path(path, sizeof(path), name);
	snprintf(args, sizeof(args), "run -m %s/models/stories260K/%s %s%s%s -d %s/text/%s %s --samples 6 --max-tokens 48 -j %u -q -f --json -o %s",
		 dd, model, tok ? "-t " : "", tok ? dd : "", tok ? tok : "", dd, dataset, extra, threads, path);
	cr_assert_eq(run_cmd(args, out, sizeof(out), err, sizeof(err)), 0, "%s\n%s", args, err);
	cr_assert(strstr(out, "\"samples\":6"), "%s", out);
	cr_assert_eq(nl_trace_open(&r, path), 0, "%s", nl_diag_msg());
	m = nl_trace_get_meta(r);
	cr_assert_eq(m->model.n_layers, 5);
	cr_assert_eq(m->model.n_neurons, 172);
	cr_assert_eq(m->model.d_model, 64);
	cr_assert(m->n_tokens > 6 && m->n_tokens <= 6 * 48);
	cr_assert(m->has_sample_ids);
	cr_assert_eq(nl_trace_read_sample_ids(r, &sid), 0, "%s", nl_diag_msg());
	for (uint64_t t = 1; t < m->n_tokens; t++)
		cr_assert_geq(sid[t], sid[t - 1], "tokens are in sample order");
	free(sid);
	for (uint32_t l = 0; l < 5; l++) {
		cr_assert(m->density[l] > 0 && m->density[l] < 1);
		if (m->sparsity == NL_SPARSITY_THRESHOLD) {
			cr_assert_not_null(m->threshold);
			cr_assert(m->threshold[l] > 0);
			cr_assert(fabs(m->density[l] - m->target_density) < 0.05, "layer %u density %g", l, m->density[l]);
		}
	}
	cr_assert_eq(nl_trace_read_layer(r, 0, layer0), 0, "%s", nl_diag_msg());
	cr_assert_eq(nl_csr_validate(layer0, path), 0, "%s", nl_diag_msg());
	nl_trace_close(r);
}

Test(e2e, stories260K_real_datasets, .timeout = 120)
{
	struct nl_csr a, b, c;

	if (!data_dir())
		cr_skip_test("NL_DATA_DIR with the real data is not set");
	/* GSM8K, threshold rule, llama2.c checkpoint; -j1 and -j2 give the same trace. */
	profile_and_check("stories260K.bin", "/models/stories260K/tok512.bin", "gsm8k/test.jsonl",
			  "--fields question,answer --sparsity threshold --density 0.3", "gsm1.h5", 1, &a);
	profile_and_check("stories260K.bin", "/models/stories260K/tok512.bin", "gsm8k/test.jsonl",
			  "--fields question,answer --sparsity threshold --density 0.3", "gsm2.h5", 2, &b);
	cr_assert(csr_equal(&a, &b), "thread count changes the trace");
	/* GGUF with its embedded vocabulary gives the same active sets as the llama2.c file. */
	profile_and_check("stories260K-f32.gguf", NULL, "gsm8k/test.jsonl",
			  "--fields question,answer --sparsity threshold --density 0.3", "gsm3.h5", 2, &c);
	cr_assert(csr_equal(&a, &c), "GGUF F32 and llama2.c traces differ");
	nl_csr_free(&a);
	nl_csr_free(&b);
	nl_csr_free(&c);
	/* WikiText-2 (one paragraph per line), topk. */
	profile_and_check("stories260K.bin", "/models/stories260K/tok512.bin", "wikitext2/wiki.test.raw",
			  "--format lines --sparsity topk --density 0.2", "wiki.h5", 2, &a);
	for (uint64_t t = 0; t < a.n_tokens; t++)
		cr_assert_eq(a.indptr[t + 1] - a.indptr[t], nl_topk_count(0.2, 172));
	nl_csr_free(&a);
	/* Pre-tokenised ids need no tokenizer; ids are checked against the vocabulary. */
	{
		char ids_path[512], out_path[512], args[2048], err[8192];

		tmp_path(ids_path, sizeof(ids_path), "e2e.ids");
		write_file(ids_path, "1 400 32 17\n1 5 6 7 8 9\n", strlen("1 400 32 17\n1 5 6 7 8 9\n"));
		tmp_path(out_path, sizeof(out_path), "ids.h5");
		snprintf(args, sizeof(args), "run -m %s/models/stories260K/stories260K.bin -d %s --split-role all --sparsity topk --density 0.5 -q -f -o %s",
			 data_dir(), ids_path, out_path);
		cr_assert_eq(run_cmd(args, NULL, 0, err, sizeof(err)), 0, "%s", err);
		write_file(ids_path, "1 2\n1 512\n", strlen("1 2\n1 512\n"));
		cr_assert_eq(run_cmd(args, NULL, 0, err, sizeof(err)), 1);
		cr_assert(strstr(err, "line 2") && strstr(err, "512"), "%s", err);
	}
	/* Alpaca on the GGUF model, relu rule on the SwiGLU gate. */
	profile_and_check("stories260K-f32.gguf", NULL, "alpaca/alpaca_data_1k.json",
			  "--fields instruction,input,output --sparsity relu", "alpaca.h5", 2, &a);
	nl_csr_free(&a);
}
