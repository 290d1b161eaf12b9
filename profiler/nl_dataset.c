/*
 * Dataset readers for profiling: plain text paragraphs, JSON lines, JSON
 * arrays (with field selection), HellaSwag's 6-line format and pre-tokenised
 * id files; plus the deterministic sample selection and the train/test split.
 *
 * Files are read whole (datasets for profiling are megabytes, not gigabytes).
 * Every error names the file, the line and what is wrong.
 */
#include <errno.h>
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "nl_profile.h"
#include "nl_rng.h"

extern char **environ;

struct nl_dataset {
	char *path;
	enum nl_ds_format format;
	struct nl_sample *samples;
	size_t n, cap;
};

/* ---- growable byte buffer ---- */

struct sbuf {
	char *p;
	size_t len, cap;
};

static int sbuf_reserve(struct sbuf *b, size_t extra)
{
	size_t cap;
	char *p;

	if (b->len + extra + 1 <= b->cap)
		return 0;
	cap = b->cap ? b->cap * 2 : 256;
	while (cap < b->len + extra + 1)
		cap *= 2;
	p = realloc(b->p, cap);
	if (!p)
		return -ENOMEM;
	b->p = p;
	b->cap = cap;
	return 0;
}

static int sbuf_add(struct sbuf *b, const char *s, size_t n)
{
	int err = sbuf_reserve(b, n);

	if (err)
		return err;
	memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
	return 0;
}

static int sbuf_addc(struct sbuf *b, char c)
{
	return sbuf_add(b, &c, 1);
}

/* ---- formats ---- */

static const char *const format_names[] = {
	[NL_DS_TEXT] = "text",
	[NL_DS_JSONL] = "jsonl",
	[NL_DS_JSON] = "json",
	[NL_DS_HELLASWAG] = "hellaswag",
	[NL_DS_IDS] = "ids",
	[NL_DS_LINES] = "lines",
};

int nl_ds_format_parse(enum nl_ds_format *f, const char *name)
{
	for (size_t i = 0; i < sizeof(format_names) / sizeof(format_names[0]); i++) {
		if (name && !strcmp(name, format_names[i])) {
			*f = (enum nl_ds_format)i;
			return 0;
		}
	}
	return nl_diag(NL_E_INVAL, "unknown dataset format '%s'; expected text, lines, jsonl, json, hellaswag or ids",
		       name ? name : "");
}

const char *nl_ds_format_name(enum nl_ds_format f)
{
	if ((unsigned)f < sizeof(format_names) / sizeof(format_names[0]))
		return format_names[f];
	return "?";
}

/* ---- reading files ---- */

static bool ends_with(const char *s, const char *suffix)
{
	size_t a = strlen(s), b = strlen(suffix);

	return a >= b && !strcmp(s + a - b, suffix);
}

static int read_fd_all(int fd, struct sbuf *b)
{
	for (;;) {
		ssize_t got;
		int err = sbuf_reserve(b, 65536);

		if (err)
			return err;
		got = read(fd, b->p + b->len, b->cap - b->len - 1);
		if (got < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (got == 0)
			break;
		b->len += (size_t)got;
	}
	b->p[b->len] = 0;
	return 0;
}

/* Decompresses through the bzip2 program: no library dependency for one dataset. */
static int read_bz2(const char *path, struct sbuf *b)
{
	posix_spawn_file_actions_t fa;
	char *argv[] = { "bzip2", "-dc", "--", (char *)path, NULL };
	int pipefd[2], status = 0, err, in;
	pid_t pid;

	in = open(path, O_RDONLY);
	if (in < 0)
		return nl_diag(-errno, "'%s': cannot open: %s", path, strerror(errno));
	close(in);
	if (pipe(pipefd))
		return nl_diag(-errno, "'%s': pipe: %s", path, strerror(errno));
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_adddup2(&fa, pipefd[1], STDOUT_FILENO);
	posix_spawn_file_actions_addclose(&fa, pipefd[0]);
	posix_spawn_file_actions_addclose(&fa, pipefd[1]);
	/* bzip2's own messages would bypass our diagnostics: silence them. */
	posix_spawn_file_actions_addopen(&fa, STDERR_FILENO, "/dev/null", O_WRONLY, 0);
	err = posix_spawnp(&pid, "bzip2", &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	close(pipefd[1]);
	if (err) {
		close(pipefd[0]);
		return nl_diag(NL_E_UNSUPPORTED, "'%s': cannot run bzip2 to decompress it (%s); install bzip2 (make deps) or decompress it with 'bzip2 -dk' and pass the plain file",
			       path, strerror(err));
	}
	err = read_fd_all(pipefd[0], b);
	close(pipefd[0]);
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	if (err)
		return nl_diag(err, "'%s': reading the output of bzip2 -dc failed", path);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		if (WIFEXITED(status) && WEXITSTATUS(status) == 127)
			return nl_diag(NL_E_UNSUPPORTED, "'%s': the bzip2 program is not installed; run make deps or decompress the file yourself",
				       path);
		return nl_diag(NL_E_COMPRESS, "'%s': bzip2 -dc failed (exit status %d); the file is damaged or not bzip2",
			       path, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
	}
	return 0;
}

static int read_whole(const char *path, struct sbuf *b)
{
	int fd, err;

	if (ends_with(path, ".bz2")) {
		err = read_bz2(path, b);
		if (err)
			return err;
	} else {
		fd = open(path, O_RDONLY);
		if (fd < 0)
			return nl_diag(-errno, "'%s': cannot open: %s", path, strerror(errno));
		err = read_fd_all(fd, b);
		close(fd);
		if (err)
			return nl_diag(err, "'%s': read failed: %s", path, strerror(-err));
	}
	/* the decompressed text too: a NUL would cut samples short */
	if (memchr(b->p, 0, b->len))
		return nl_diag(NL_E_FORMAT, "'%s': contains NUL bytes; expected a text file", path);
	return 0;
}

/* ---- samples ---- */

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Adds text[0..len) stripped of surrounding whitespace; empty samples are dropped. */
static int add_text(struct nl_dataset *d, const char *text, size_t len, uint64_t line)
{
	struct nl_sample *s;
	char *copy;

	while (len && is_space(*text)) {
		if (*text == '\n')
			line++;
		text++;
		len--;
	}
	while (len && is_space(text[len - 1]))
		len--;
	if (!len)
		return 0;
	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 1024;
		struct nl_sample *grown = realloc(d->samples, cap * sizeof(*grown));

		if (!grown)
			return -ENOMEM;
		d->samples = grown;
		d->cap = cap;
	}
	copy = malloc(len + 1);
	if (!copy)
		return -ENOMEM;
	memcpy(copy, text, len);
	copy[len] = 0;
	s = &d->samples[d->n++];
	memset(s, 0, sizeof(*s));
	s->text = copy;
	s->len = len;
	s->line = line;
	return 0;
}

static int add_ids(struct nl_dataset *d, uint32_t *ids, size_t n, uint64_t line)
{
	struct nl_sample *s;

	if (d->n == d->cap) {
		size_t cap = d->cap ? d->cap * 2 : 1024;
		struct nl_sample *grown = realloc(d->samples, cap * sizeof(*grown));

		if (!grown)
			return -ENOMEM;
		d->samples = grown;
		d->cap = cap;
	}
	s = &d->samples[d->n++];
	memset(s, 0, sizeof(*s));
	s->ids = ids;
	s->n_ids = n;
	s->line = line;
	return 0;
}

/* Next line of buf starting at *pos: [start, end) without "\r\n"/"\n"; false at the end. */
static bool next_line(const char *buf, size_t len, size_t *pos, size_t *start, size_t *end)
{
	const char *nl;

	if (*pos >= len)
		return false;
	*start = *pos;
	nl = memchr(buf + *pos, '\n', len - *pos);
	*end = nl ? (size_t)(nl - buf) : len;
	*pos = nl ? *end + 1 : len;
	if (*end > *start && buf[*end - 1] == '\r')
		(*end)--;
	return true;
}

static bool blank(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (!is_space(s[i]))
			return false;
	return true;
}

static int parse_lines(struct nl_dataset *d, const char *buf, size_t len);

/*
 * Paragraphs: runs of non-blank lines, joined with "\n" (CRs removed). A file
 * with several lines and not one blank line (WikiText-2 raw) has one paragraph
 * per line: reading it as one giant sample is never what is meant.
 */
static int parse_text_paragraphs(struct nl_dataset *d, const char *buf, size_t len)
{
	struct sbuf para = { 0 };
	size_t pos = 0, a, b;
	uint64_t line = 0, first = 0;
	bool blank_seen = false;
	int err = 0;

	while (next_line(buf, len, &pos, &a, &b)) {
		line++;
		if (blank(buf + a, b - a)) {
			blank_seen = true;
			if (para.len) {
				err = add_text(d, para.p, para.len, first);
				if (err)
					goto out;
				para.len = 0;
			}
			continue;
		}
		if (!para.len)
			first = line;
		else if ((err = sbuf_addc(&para, '\n')))
			goto out;
		err = sbuf_add(&para, buf + a, b - a);
		if (err)
			goto out;
	}
	if (para.len) {
		if (first == 1 && d->n == 0 && line > 1 && !blank_seen) {
			free(para.p);
			return parse_lines(d, buf, len);
		}
		err = add_text(d, para.p, para.len, first);
	}
out:
	free(para.p);
	return err;
}

static int parse_lines(struct nl_dataset *d, const char *buf, size_t len)
{
	size_t pos = 0, a, b;
	uint64_t line = 0;

	while (next_line(buf, len, &pos, &a, &b)) {
		int err = add_text(d, buf + a, b - a, ++line);

		if (err)
			return err;
	}
	return 0;
}

static int parse_text_separated(struct nl_dataset *d, const char *buf, size_t len, const char *sep)
{
	size_t seplen = strlen(sep), pos = 0;
	uint64_t line = 1;

	if (!seplen)
		return nl_diag(NL_E_INVAL, "'%s': empty text separator", d->path);
	while (pos <= len) {
		const char *hit = memmem(buf + pos, len - pos, sep, seplen);
		size_t end = hit ? (size_t)(hit - buf) : len;
		int err = add_text(d, buf + pos, end - pos, line);

		if (err)
			return err;
		for (size_t i = pos; i < end + (hit ? seplen : 0) && i < len; i++)
			line += buf[i] == '\n';
		if (!hit)
			break;
		pos = end + seplen;
	}
	return 0;
}

/* HellaSwag: context, gold ending index (0-3), four endings; sample = context + ' ' + gold ending. */
static int parse_hellaswag(struct nl_dataset *d, const char *buf, size_t len)
{
	size_t pos = 0, a[6], b[6];
	uint64_t line = 0;
	struct sbuf text = { 0 };
	int err = 0;

	for (;;) {
		uint64_t first;
		int got = 0;
		char *end;
		long gold;

		/* Blank lines between tasks (and at the end) are tolerated. */
		while (got == 0) {
			if (!next_line(buf, len, &pos, &a[0], &b[0]))
				goto out;
			line++;
			if (!blank(buf + a[0], b[0] - a[0]))
				got = 1;
		}
		first = line;
		for (; got < 6; got++) {
			if (!next_line(buf, len, &pos, &a[got], &b[got])) {
				err = nl_diag(NL_E_TRUNCATED, "'%s' line %llu: HellaSwag task starting here has %d of its 6 lines (context, gold index, 4 endings); the file is truncated",
					      d->path, (unsigned long long)first, got);
				goto out;
			}
			line++;
		}
		gold = strtol(buf + a[1], &end, 10);
		if (end == buf + a[1] || (size_t)(end - buf) != b[1] || gold < 0 || gold > 3) {
			err = nl_diag(NL_E_FORMAT, "'%s' line %llu: HellaSwag gold index '%.*s', expected 0, 1, 2 or 3 (6 lines per task: context, gold index, 4 endings)",
				      d->path, (unsigned long long)(first + 1), (int)(b[1] - a[1] > 40 ? 40 : b[1] - a[1]),
				      buf + a[1]);
			goto out;
		}
		text.len = 0;
		if ((err = sbuf_add(&text, buf + a[0], b[0] - a[0])))
			goto out;
		while (text.len && is_space(text.p[text.len - 1]))
			text.len--;
		if ((err = sbuf_addc(&text, ' ')))
			goto out;
		{
			size_t ea = a[2 + gold], eb = b[2 + gold];

			while (ea < eb && is_space(buf[ea]))
				ea++;
			if ((err = sbuf_add(&text, buf + ea, eb - ea)))
				goto out;
		}
		err = add_text(d, text.p, text.len, first);
		if (err)
			goto out;
	}
out:
	free(text.p);
	return err;
}

static int parse_ids(struct nl_dataset *d, const char *buf, size_t len)
{
	size_t pos = 0, a, b;
	uint64_t line = 0;

	while (next_line(buf, len, &pos, &a, &b)) {
		uint32_t *ids = NULL;
		size_t n = 0, cap = 0, i = a;
		int err;

		line++;
		while (i < b) {
			unsigned long long v = 0;
			size_t start;

			while (i < b && is_space(buf[i]))
				i++;
			if (i >= b)
				break;
			start = i;
			while (i < b && buf[i] >= '0' && buf[i] <= '9') {
				v = v * 10 + (unsigned)(buf[i] - '0');
				if (v > UINT32_MAX)
					break;
				i++;
			}
			if (i == start || (i < b && !is_space(buf[i])) || v > UINT32_MAX) {
				size_t e = start;

				while (e < b && !is_space(buf[e]))
					e++;
				free(ids);
				return nl_diag(NL_E_FORMAT, "'%s' line %llu column %zu: '%.*s' is not a token id; expected whitespace-separated integers 0..4294967295, one sample per line",
					       d->path, (unsigned long long)line, start - a + 1,
					       (int)(e - start > 40 ? 40 : e - start), buf + start);
			}
			if (n == cap) {
				uint32_t *grown;

				cap = cap ? cap * 2 : 64;
				grown = realloc(ids, cap * sizeof(*ids));
				if (!grown) {
					free(ids);
					return -ENOMEM;
				}
				ids = grown;
			}
			ids[n++] = (uint32_t)v;
		}
		if (!n)
			continue;
		err = add_ids(d, ids, n, line);
		if (err) {
			free(ids);
			return err;
		}
	}
	return 0;
}

/* ---- a small JSON parser (RFC 8259) ---- */

struct json {
	const char *path;
	const char *buf, *p, *end;
	uint64_t line;
	const char *line_start;
	int depth;
};

#define JSON_MAX_DEPTH 64

static int json_error(struct json *j, const char *what)
{
	return nl_diag(NL_E_FORMAT, "'%s' line %llu column %zu: %s", j->path, (unsigned long long)j->line,
		       (size_t)(j->p - j->line_start) + 1, what);
}

static void json_ws(struct json *j)
{
	while (j->p < j->end && (*j->p == ' ' || *j->p == '\t' || *j->p == '\n' || *j->p == '\r')) {
		if (*j->p == '\n') {
			j->line++;
			j->line_start = j->p + 1;
		}
		j->p++;
	}
}

static int hex4(const char *s, uint32_t *out)
{
	uint32_t v = 0;

	for (int i = 0; i < 4; i++) {
		char c = s[i];

		v <<= 4;
		if (c >= '0' && c <= '9')
			v |= (uint32_t)(c - '0');
		else if (c >= 'a' && c <= 'f')
			v |= (uint32_t)(c - 'a' + 10);
		else if (c >= 'A' && c <= 'F')
			v |= (uint32_t)(c - 'A' + 10);
		else
			return -1;
	}
	*out = v;
	return 0;
}

static int utf8_put(struct sbuf *b, uint32_t cp)
{
	char u[4];
	size_t n;

	if (cp < 0x80) {
		u[0] = (char)cp;
		n = 1;
	} else if (cp < 0x800) {
		u[0] = (char)(0xc0 | (cp >> 6));
		u[1] = (char)(0x80 | (cp & 0x3f));
		n = 2;
	} else if (cp < 0x10000) {
		u[0] = (char)(0xe0 | (cp >> 12));
		u[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
		u[2] = (char)(0x80 | (cp & 0x3f));
		n = 3;
	} else {
		u[0] = (char)(0xf0 | (cp >> 18));
		u[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
		u[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
		u[3] = (char)(0x80 | (cp & 0x3f));
		n = 4;
	}
	return sbuf_add(b, u, n);
}

/* Parses a string at j->p (the opening quote) into out (when not NULL), decoding escapes to UTF-8. */
static int json_string(struct json *j, struct sbuf *out)
{
	if (j->p >= j->end || *j->p != '"')
		return json_error(j, "expected a string");
	j->p++;
	if (out)
		out->len = 0;
	for (;;) {
		const char *run = j->p;
		int err;

		while (j->p < j->end && *j->p != '"' && *j->p != '\\' && (unsigned char)*j->p >= 0x20)
			j->p++;
		if (out && j->p > run && (err = sbuf_add(out, run, (size_t)(j->p - run))))
			return err;
		if (j->p >= j->end)
			return json_error(j, "unterminated string");
		if (*j->p == '"') {
			j->p++;
			break;
		}
		if ((unsigned char)*j->p < 0x20)
			return json_error(j, "raw control character in a string; it must be escaped (\\n, \\t, \\u00XX)");
		/* Backslash escape. */
		if (j->end - j->p < 2)
			return json_error(j, "unterminated escape");
		{
			char c = j->p[1];
			uint32_t cp;
			char lit = 0;

			switch (c) {
			case '"': lit = '"'; break;
			case '\\': lit = '\\'; break;
			case '/': lit = '/'; break;
			case 'b': lit = '\b'; break;
			case 'f': lit = '\f'; break;
			case 'n': lit = '\n'; break;
			case 'r': lit = '\r'; break;
			case 't': lit = '\t'; break;
			case 'u':
				if (j->end - j->p < 6 || hex4(j->p + 2, &cp))
					return json_error(j, "bad \\u escape: expected 4 hex digits");
				j->p += 6;
				if (cp >= 0xd800 && cp < 0xdc00) {
					uint32_t lo;

					/* A high surrogate must be followed by \uDC00-\uDFFF. */
					if (j->end - j->p >= 6 && j->p[0] == '\\' && j->p[1] == 'u' &&
					    !hex4(j->p + 2, &lo) && lo >= 0xdc00 && lo < 0xe000) {
						cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
						j->p += 6;
					} else {
						j->p -= 6;
						return json_error(j, "unpaired UTF-16 high surrogate in \\u escape");
					}
				} else if (cp >= 0xdc00 && cp < 0xe000) {
					j->p -= 6;
					return json_error(j, "unpaired UTF-16 low surrogate in \\u escape");
				}
				if (out && (err = utf8_put(out, cp)))
					return err;
				continue;
			default:
				return json_error(j, "unknown escape in a string; valid: \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX");
			}
			j->p += 2;
			if (out && (err = sbuf_addc(out, lit)))
				return err;
		}
	}
	if (out && !out->p && (sbuf_reserve(out, 0)))
		return -ENOMEM;
	if (out)
		out->p[out->len] = 0;
	return 0;
}

static int json_skip_value(struct json *j);

static int json_literal(struct json *j, const char *word)
{
	size_t n = strlen(word);

	if ((size_t)(j->end - j->p) < n || memcmp(j->p, word, n))
		return json_error(j, "unexpected character; expected a JSON value");
	j->p += n;
	return 0;
}

static int json_number(struct json *j)
{
	if (j->p < j->end && *j->p == '-')
		j->p++;
	if (j->p >= j->end || *j->p < '0' || *j->p > '9')
		return json_error(j, "bad number");
	if (*j->p == '0')
		j->p++;
	else
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	if (j->p < j->end && *j->p == '.') {
		j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return json_error(j, "bad number: digits expected after '.'");
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	if (j->p < j->end && (*j->p == 'e' || *j->p == 'E')) {
		j->p++;
		if (j->p < j->end && (*j->p == '+' || *j->p == '-'))
			j->p++;
		if (j->p >= j->end || *j->p < '0' || *j->p > '9')
			return json_error(j, "bad number: digits expected in the exponent");
		while (j->p < j->end && *j->p >= '0' && *j->p <= '9')
			j->p++;
	}
	return 0;
}

static int json_skip_container(struct json *j, char open, char close)
{
	int err;
	bool first = true;

	if (++j->depth > JSON_MAX_DEPTH)
		return json_error(j, "nesting deeper than 64 levels");
	j->p++;
	for (;;) {
		json_ws(j);
		if (j->p < j->end && *j->p == close && first) {
			j->p++;
			break;
		}
		if (open == '{') {
			if ((err = json_string(j, NULL)))
				return err;
			json_ws(j);
			if (j->p >= j->end || *j->p != ':')
				return json_error(j, "expected ':' after an object key");
			j->p++;
		}
		if ((err = json_skip_value(j)))
			return err;
		json_ws(j);
		first = false;
		if (j->p < j->end && *j->p == ',') {
			j->p++;
			continue;
		}
		if (j->p < j->end && *j->p == close) {
			j->p++;
			break;
		}
		return json_error(j, open == '{' ? "expected ',' or '}' in an object" : "expected ',' or ']' in an array");
	}
	j->depth--;
	return 0;
}

static int json_skip_value(struct json *j)
{
	json_ws(j);
	if (j->p >= j->end)
		return json_error(j, "unexpected end of input; expected a JSON value");
	switch (*j->p) {
	case '"': return json_string(j, NULL);
	case '{': return json_skip_container(j, '{', '}');
	case '[': return json_skip_container(j, '[', ']');
	case 't': return json_literal(j, "true");
	case 'f': return json_literal(j, "false");
	case 'n': return json_literal(j, "null");
	default: return json_number(j);
	}
}

/* Selected fields of the current record, collected while parsing one object. */
struct record {
	const char *fields;        /* comma-separated, or NULL = all string fields */
	size_t n_fields;
	struct sbuf *values;       /* [n_fields] when fields given */
	bool *seen;
	struct sbuf all;           /* fields == NULL: the joined text */
	struct sbuf key, val;
	char *present;             /* keys seen, for the error message */
};

static bool field_index(const char *fields, const char *key, size_t *idx)
{
	size_t klen = strlen(key), i = 0;
	const char *f = fields;

	for (;;) {
		const char *comma = strchr(f, ',');
		size_t n = comma ? (size_t)(comma - f) : strlen(f);

		if (n == klen && !memcmp(f, key, n)) {
			*idx = i;
			return true;
		}
		if (!comma)
			return false;
		f = comma + 1;
		i++;
	}
}

static int field_name(const char *fields, size_t idx, char *out, size_t size)
{
	const char *f = fields;

	for (size_t i = 0; i < idx; i++)
		f = strchr(f, ',') + 1;
	snprintf(out, size, "%.*s", (int)(strchr(f, ',') ? (size_t)(strchr(f, ',') - f) : strlen(f)), f);
	return 0;
}

/* Parses one record (object or string) at j->p and adds the sample. */
static int json_record(struct json *j, struct nl_dataset *d, struct record *r)
{
	uint64_t line;
	int err;

	json_ws(j);
	line = j->line;
	if (j->p < j->end && *j->p == '"') {
		/* A bare string is the sample itself; only valid without --fields. */
		if (r->fields)
			return json_error(j, "record is a string but --fields was given; expected an object");
		if ((err = json_string(j, &r->val)))
			return err;
		return add_text(d, r->val.p, r->val.len, line);
	}
	if (j->p >= j->end || *j->p != '{')
		return json_error(j, "expected an object (or a string) as a record");
	if (++j->depth > JSON_MAX_DEPTH)
		return json_error(j, "nesting deeper than 64 levels");
	j->p++;
	r->all.len = 0;
	for (size_t i = 0; i < r->n_fields; i++)
		r->seen[i] = false;
	json_ws(j);
	if (j->p < j->end && *j->p == '}') {
		j->p++;
	} else {
		for (;;) {
			size_t idx = 0;
			bool want;

			json_ws(j);
			if ((err = json_string(j, &r->key)))
				return err;
			json_ws(j);
			if (j->p >= j->end || *j->p != ':')
				return json_error(j, "expected ':' after an object key");
			j->p++;
			json_ws(j);
			want = r->fields ? field_index(r->fields, r->key.p, &idx) : true;
			if (want && j->p < j->end && *j->p == '"') {
				if ((err = json_string(j, &r->val)))
					return err;
				if (r->fields) {
					if (r->seen[idx])
						return json_error(j, "field given twice in one record");
					r->seen[idx] = true;
					r->values[idx].len = 0;
					if ((err = sbuf_add(&r->values[idx], r->val.p, r->val.len)))
						return err;
				} else if (r->val.len) {
					if (r->all.len && (err = sbuf_addc(&r->all, '\n')))
						return err;
					if ((err = sbuf_add(&r->all, r->val.p, r->val.len)))
						return err;
				}
			} else if (want && r->fields) {
				char msg[200];

				snprintf(msg, sizeof(msg), "field '%s' is not a string; --fields selects string fields only",
					 r->key.p);
				return json_error(j, msg);
			} else if ((err = json_skip_value(j))) {
				return err;
			}
			json_ws(j);
			if (j->p < j->end && *j->p == ',') {
				j->p++;
				continue;
			}
			if (j->p < j->end && *j->p == '}') {
				j->p++;
				break;
			}
			return json_error(j, "expected ',' or '}' in an object");
		}
	}
	j->depth--;
	if (r->fields) {
		r->all.len = 0;
		for (size_t i = 0; i < r->n_fields; i++) {
			if (!r->seen[i]) {
				char name[NL_NAME_MAX];

				field_name(r->fields, i, name, sizeof(name));
				return nl_diag(NL_E_MISSING, "'%s' line %llu: record has no field '%s' (selected by --fields %s)",
					       d->path, (unsigned long long)line, name, r->fields);
			}
			if (!r->values[i].len)
				continue;
			if (r->all.len && (err = sbuf_addc(&r->all, '\n')))
				return err;
			if ((err = sbuf_add(&r->all, r->values[i].p, r->values[i].len)))
				return err;
		}
	}
	return add_text(d, r->all.p ? r->all.p : "", r->all.len, line);
}

static int parse_json(struct nl_dataset *d, const char *buf, size_t len, const char *fields, bool lines)
{
	struct record r = { 0 };
	struct json j = { .path = d->path, .buf = buf, .p = buf, .end = buf + len, .line = 1, .line_start = buf };
	int err = 0;

	if (fields) {
		if (!*fields || strstr(fields, ",,") || fields[0] == ',' || fields[strlen(fields) - 1] == ',')
			return nl_diag(NL_E_INVAL, "--fields '%s': expected comma-separated names like question,answer", fields);
		r.fields = fields;
		r.n_fields = 1;
		for (const char *c = fields; *c; c++)
			r.n_fields += *c == ',';
		r.values = calloc(r.n_fields, sizeof(*r.values));
		r.seen = calloc(r.n_fields, sizeof(*r.seen));
		if (!r.values || !r.seen) {
			err = -ENOMEM;
			goto out;
		}
	}
	/* A UTF-8 byte order mark is tolerated at the start. */
	if (len >= 3 && !memcmp(buf, "\xef\xbb\xbf", 3))
		j.p += 3;
	if (lines) {
		for (;;) {
			json_ws(&j);
			if (j.p >= j.end)
				break;
			err = json_record(&j, d, &r);
			if (err)
				goto out;
			/* Exactly one record per line. */
			while (j.p < j.end && (*j.p == ' ' || *j.p == '\t' || *j.p == '\r'))
				j.p++;
			if (j.p < j.end && *j.p != '\n') {
				err = json_error(&j, "text after the record; JSON lines has one record per line");
				goto out;
			}
		}
	} else {
		json_ws(&j);
		if (j.p >= j.end || *j.p != '[') {
			err = json_error(&j, "expected '[': a JSON dataset is an array of records (use --format jsonl for one record per line)");
			goto out;
		}
		j.p++;
		json_ws(&j);
		if (j.p < j.end && *j.p == ']') {
			j.p++;
		} else {
			for (;;) {
				err = json_record(&j, d, &r);
				if (err)
					goto out;
				json_ws(&j);
				if (j.p < j.end && *j.p == ',') {
					j.p++;
					continue;
				}
				if (j.p < j.end && *j.p == ']') {
					j.p++;
					break;
				}
				err = json_error(&j, "expected ',' or ']' after a record");
				goto out;
			}
		}
		json_ws(&j);
		if (j.p < j.end) {
			err = json_error(&j, "text after the closing ']'");
			goto out;
		}
	}
out:
	for (size_t i = 0; r.values && i < r.n_fields; i++)
		free(r.values[i].p);
	free(r.values);
	free(r.seen);
	free(r.all.p);
	free(r.key.p);
	free(r.val.p);
	return err;
}

/* ---- public API ---- */

int nl_dataset_open(struct nl_dataset **out, const char *path, const struct nl_dataset_opts *opts)
{
	struct nl_dataset *d;
	struct sbuf buf = { 0 };
	int err;

	*out = NULL;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -ENOMEM;
	d->path = strdup(path);
	d->format = opts->format;
	if (!d->path) {
		err = -ENOMEM;
		goto fail;
	}
	err = read_whole(path, &buf);
	if (err)
		goto fail;
	if (!buf.p && (err = sbuf_reserve(&buf, 0)))
		goto fail;
	switch (opts->format) {
	case NL_DS_TEXT:
		err = opts->separator ? parse_text_separated(d, buf.p, buf.len, opts->separator)
				      : parse_text_paragraphs(d, buf.p, buf.len);
		break;
	case NL_DS_LINES:
		err = parse_lines(d, buf.p, buf.len);
		break;
	case NL_DS_JSONL:
		err = parse_json(d, buf.p, buf.len, opts->fields, true);
		break;
	case NL_DS_JSON:
		err = parse_json(d, buf.p, buf.len, opts->fields, false);
		break;
	case NL_DS_HELLASWAG:
		err = parse_hellaswag(d, buf.p, buf.len);
		break;
	case NL_DS_IDS:
		err = parse_ids(d, buf.p, buf.len);
		break;
	default:
		err = nl_diag(NL_E_INVAL, "'%s': unknown dataset format %d", path, (int)opts->format);
	}
	if (err)
		goto fail;
	if (!d->n) {
		err = nl_diag(NL_E_FORMAT, "'%s': no samples found as --format %s; check the format and the file",
			      path, nl_ds_format_name(opts->format));
		goto fail;
	}
	free(buf.p);
	*out = d;
	return 0;
fail:
	if (err == -ENOMEM)
		nl_diag(err, "'%s': out of memory reading the dataset", path);
	free(buf.p);
	nl_dataset_free(d);
	return err;
}

size_t nl_dataset_count(const struct nl_dataset *d)
{
	return d->n;
}

const struct nl_sample *nl_dataset_sample(const struct nl_dataset *d, size_t i)
{
	return i < d->n ? &d->samples[i] : NULL;
}

void nl_dataset_free(struct nl_dataset *d)
{
	if (!d)
		return;
	for (size_t i = 0; i < d->n; i++) {
		free((char *)d->samples[i].text);
		free((uint32_t *)d->samples[i].ids);
	}
	free(d->samples);
	free(d->path);
	free(d);
}

/* ---- selection and split ---- */

static const char *const role_names[] = { "all", "train", "test" };

int nl_split_role_parse(enum nl_split_role *r, const char *name)
{
	for (int i = 0; i < 3; i++) {
		if (name && !strcmp(name, role_names[i])) {
			*r = (enum nl_split_role)i;
			return 0;
		}
	}
	return nl_diag(NL_E_INVAL, "unknown split role '%s'; expected all, train or test", name ? name : "");
}

const char *nl_split_role_name(enum nl_split_role r)
{
	return (unsigned)r < 3 ? role_names[r] : "?";
}

bool nl_dataset_is_test(uint64_t index, double test_fraction)
{
	/* A fixed key: the split must not move with --seed or --samples. */
	uint64_t x = index ^ 0x5eed5b117e57ull;
	uint64_t h = nl_splitmix64(&x);

	return (double)(h >> 11) * 0x1.0p-53 < test_fraction;
}

static int cmp_u32(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

	return x < y ? -1 : x > y;
}

int nl_dataset_select(const struct nl_dataset *d, const struct nl_select_opts *o,
		      uint32_t **idx, size_t *n)
{
	uint32_t *pool;
	size_t m = 0, want;
	struct nl_rng rng;

	*idx = NULL;
	*n = 0;
	if (o->role != NL_SPLIT_ALL && !(o->test_fraction > 0 && o->test_fraction < 1))
		return nl_diag(NL_E_INVAL, "test fraction %g out of range, expected 0 < f < 1", o->test_fraction);
	if (d->n > UINT32_MAX)
		return nl_diag(NL_E_INVAL, "'%s': %zu samples, at most 2^32-1 supported", d->path, d->n);
	pool = malloc((d->n ? d->n : 1) * sizeof(*pool));
	if (!pool)
		return -ENOMEM;
	for (size_t i = 0; i < d->n; i++) {
		bool test = o->role != NL_SPLIT_ALL && nl_dataset_is_test(i, o->test_fraction);

		if (o->role == NL_SPLIT_ALL || (o->role == NL_SPLIT_TEST) == test)
			pool[m++] = (uint32_t)i;
	}
	want = o->n_samples && o->n_samples < m ? (size_t)o->n_samples : m;
	/* Partial Fisher-Yates: the first `want` slots become a seeded uniform sample. */
	nl_rng_seed(&rng, o->seed, 0xda7a5e7, 0);
	for (size_t i = 0; i < want && m > 1; i++) {
		size_t j = i + nl_rng_below(&rng, (uint32_t)(m - i));
		uint32_t t = pool[i];

		pool[i] = pool[j];
		pool[j] = t;
	}
	qsort(pool, want, sizeof(*pool), cmp_u32);
	if (!want) {
		free(pool);
		return nl_diag(NL_E_INVAL, "'%s': no samples in the %s role (%zu samples, test fraction %g)",
			       d->path, nl_split_role_name(o->role), d->n, o->test_fraction);
	}
	*idx = pool;
	*n = want;
	return 0;
}
