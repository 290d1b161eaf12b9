#include "nl_cli.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "nl_err.h"

static const char *prog_name = "neuralink";

void nl_cli_init(const char *prog)
{
	prog_name = prog;
}

const char *nl_cli_prog(void)
{
	return prog_name;
}

noreturn void nl_die(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: error: ", prog_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

noreturn void nl_die_err(int err, const char *context)
{
	const char *msg = nl_diag_msg();

	if (!msg[0])
		msg = nl_strerror(err);
	if (context && context[0])
		nl_die("%s: %s", context, msg);
	nl_die("%s", msg);
}

noreturn void nl_usage_error(const char *usage, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n%sTry '%s --help' for more information.\n", usage, prog_name);
	exit(2);
}

void nl_warn(const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: warning: ", prog_name);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

void nl_print_version(void)
{
	printf("%s (neuralink) %s\n", prog_name, NL_VERSION);
}

void nl_check_output(const char *path, bool force)
{
	if (!force && access(path, F_OK) == 0)
		nl_die("'%s' exists; pass -f/--force to overwrite it", path);
}

uint64_t nl_parse_u64(const char *usage, const char *opt, const char *s)
{
	char *end;
	unsigned long long v;

	errno = 0;
	if (!s || !*s || *s == '-')
		nl_usage_error(usage, "%s: '%s' is not a non-negative integer", opt, s ? s : "");
	v = strtoull(s, &end, 10);
	if (errno || *end)
		nl_usage_error(usage, "%s: '%s' is not a non-negative integer", opt, s);
	return v;
}

uint64_t nl_parse_u64_in(const char *usage, const char *opt, const char *s, uint64_t min,
			 uint64_t max)
{
	uint64_t v = nl_parse_u64(usage, opt, s);

	if (v < min || v > max)
		nl_usage_error(usage, "%s: '%s' is out of range %" PRIu64 "..%" PRIu64, opt, s, min,
			       max);
	return v;
}

uint32_t nl_online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);

	return n < 1 ? 1 : n > 1024 ? 1024 : (uint32_t)n;
}

const char *nl_base_name(const char *path)
{
	const char *slash = strrchr(path, '/');

	return slash ? slash + 1 : path;
}

double nl_parse_double(const char *usage, const char *opt, const char *s)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno || end == s || *end || !isfinite(v))
		nl_usage_error(usage, "%s: '%s' is not a number", opt, s);
	return v;
}

void nl_parse_range(const char *usage, const char *opt, const char *s,
		    uint32_t *first, uint32_t *count)
{
	unsigned long a, b;
	char *end;

	errno = 0;
	a = strtoul(s, &end, 10);
	if (end == s || errno)
		goto bad;
	b = a;
	if (*end == '-') {
		const char *p = end + 1;

		b = strtoul(p, &end, 10);
		if (end == p || errno)
			goto bad;
	}
	if (*end || b < a || b >= UINT32_MAX)
		goto bad;
	*first = (uint32_t)a;
	*count = (uint32_t)(b - a + 1);
	return;
bad:
	nl_usage_error(usage, "%s: '%s' is not a layer range like '3' or '0-15'", opt, s);
}

double nl_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void nl_progress_init(struct nl_progress *p, const char *what, uint64_t total,
		      const char *unit, bool quiet)
{
	memset(p, 0, sizeof(*p));
	p->what = what;
	p->unit = unit;
	p->total = total;
	p->start = nl_now();
	p->last = p->start;
	p->tty = isatty(STDERR_FILENO);
	p->quiet = quiet;
}

static void progress_draw(struct nl_progress *p, uint64_t done, double now, bool final)
{
	double elapsed = now - p->start;
	double rate = elapsed > 0 ? (double)done / elapsed : 0;

	fprintf(stderr, "%s%s: %" PRIu64, p->tty ? "\r" : "", p->what, done);
	if (p->total)
		fprintf(stderr, "/%" PRIu64 " %s (%.1f%%)", p->total, p->unit,
			100.0 * (double)done / (double)p->total);
	else
		fprintf(stderr, " %s", p->unit);
	fprintf(stderr, ", %.4g %s/s", rate, p->unit);
	if (final) {
		fprintf(stderr, ", %.1f s\n", elapsed);
	} else if (p->total && rate > 0 && done <= p->total) {
		double eta = (double)(p->total - done) / rate;

		fprintf(stderr, ", ETA %d:%02d   ", (int)(eta / 60), (int)fmod(eta, 60));
	}
	if (!p->tty && !final)
		fputc('\n', stderr);
	fflush(stderr);
	p->drawn = true;
}

void nl_progress_update(struct nl_progress *p, uint64_t done)
{
	double now;

	if (p->quiet)
		return;
	now = nl_now();
	if (now - p->last < (p->tty ? 0.2 : 10.0))
		return;
	p->last = now;
	progress_draw(p, done, now, false);
}

void nl_progress_done(struct nl_progress *p, uint64_t done)
{
	if (p->quiet)
		return;
	progress_draw(p, done, nl_now(), true);
}

void nl_json_init(struct nl_json *j, FILE *f)
{
	memset(j, 0, sizeof(*j));
	j->f = f;
}

static void json_escaped(FILE *f, const char *s);

/* Comma before every member but the first, then "key": inside objects. */
static void json_key(struct nl_json *j, const char *key)
{
	if (j->need_comma[j->depth])
		fputc(',', j->f);
	j->need_comma[j->depth] = true;
	if (key) {
		json_escaped(j->f, key);
		fputc(':', j->f);
	}
}

static void json_escaped(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
	fputc('"', f);
}

void nl_json_obj_begin(struct nl_json *j, const char *key)
{
	json_key(j, key);
	fputc('{', j->f);
	j->need_comma[++j->depth] = false;
}

void nl_json_obj_end(struct nl_json *j)
{
	fputc('}', j->f);
	j->depth--;
}

void nl_json_arr_begin(struct nl_json *j, const char *key)
{
	json_key(j, key);
	fputc('[', j->f);
	j->need_comma[++j->depth] = false;
}

void nl_json_arr_end(struct nl_json *j)
{
	fputc(']', j->f);
	j->depth--;
}

void nl_json_str(struct nl_json *j, const char *key, const char *value)
{
	json_key(j, key);
	json_escaped(j->f, value);
}

void nl_json_u64(struct nl_json *j, const char *key, uint64_t value)
{
	json_key(j, key);
	fprintf(j->f, "%" PRIu64, value);
}

void nl_json_i64(struct nl_json *j, const char *key, int64_t value)
{
	json_key(j, key);
	fprintf(j->f, "%" PRId64, value);
}

void nl_json_double(struct nl_json *j, const char *key, double value)
{
	json_key(j, key);
	if (isfinite(value))
		fprintf(j->f, "%.10g", value);
	else
		fputs("null", j->f);
}

void nl_json_bool(struct nl_json *j, const char *key, bool value)
{
	json_key(j, key);
	fputs(value ? "true" : "false", j->f);
}

void nl_json_end(struct nl_json *j)
{
	fputc('\n', j->f);
	fflush(j->f);
}
