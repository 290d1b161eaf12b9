/*
 * What every nl-* program shares: error exits, usage handling, --version,
 * the progress line and a small JSON writer for --json. Only programs use
 * this; libraries never print.
 */
#ifndef NL_CLI_H
#define NL_CLI_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdnoreturn.h>

/* Sets the program name used as the prefix of every message ("nl-coact"). */
void nl_cli_init(const char *prog);
const char *nl_cli_prog(void);

/* "prog: error: <message>\n" on stderr, exit 1. */
noreturn void nl_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Exit 1 with the library diagnostic for err (nl_diag_msg(), else nl_strerror()). */
noreturn void nl_die_err(int err, const char *context);
/* "prog: <message>\n" + short usage + "Try 'prog --help'." on stderr, exit 2. */
noreturn void nl_usage_error(const char *usage, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* "prog: warning: <message>\n" on stderr. */
void nl_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* "prog (neuralink) VERSION" on stdout. */
void nl_print_version(void);

/* Refuses (exit 1) when path exists and !force, before any long work starts. */
void nl_check_output(const char *path, bool force);

/* Option value parsers: exit 2 with a usage error naming the option on bad input. */
uint64_t nl_parse_u64(const char *usage, const char *opt, const char *s);
double nl_parse_double(const char *usage, const char *opt, const char *s);
/* nl_parse_u64 that also refuses values outside min..max: "opt: 'S' is out of range min..max". */
uint64_t nl_parse_u64_in(const char *usage, const char *opt, const char *s, uint64_t min,
			 uint64_t max);
/* Default worker count of -j/--threads: the online CPUs, clamped to 1..1024. */
uint32_t nl_online_cpus(void);
/* The last component of path (after the last '/'), for short names in reports. */
const char *nl_base_name(const char *path);
/* "a-b" or "a" (inclusive) into [*first, *first + *count). */
void nl_parse_range(const char *usage, const char *opt, const char *s,
		    uint32_t *first, uint32_t *count);

/*
 * Progress line on stderr: "what: done/total unit (x.x%) rate unit/s ETA m:ss".
 * Redrawn with '\r' at most 5 times a second when stderr is a terminal;
 * otherwise one line every 10 s. Silent when quiet.
 */
struct nl_progress {
	const char *what;
	const char *unit;
	uint64_t total;
	double start;
	double last;
	bool tty;
	bool quiet;
	bool drawn;
};
void nl_progress_init(struct nl_progress *p, const char *what, uint64_t total,
		      const char *unit, bool quiet);
void nl_progress_update(struct nl_progress *p, uint64_t done);
void nl_progress_done(struct nl_progress *p, uint64_t done);

/* Monotonic seconds. */
double nl_now(void);

/*
 * Minimal streaming JSON writer: nl_json_obj_begin(j, "key") inside an object
 * (key NULL at top level or inside arrays), values likewise.
 */
struct nl_json {
	FILE *f;
	int depth;
	bool need_comma[32];
};
void nl_json_init(struct nl_json *j, FILE *f);
void nl_json_obj_begin(struct nl_json *j, const char *key);
void nl_json_obj_end(struct nl_json *j);
void nl_json_arr_begin(struct nl_json *j, const char *key);
void nl_json_arr_end(struct nl_json *j);
void nl_json_str(struct nl_json *j, const char *key, const char *value);
void nl_json_u64(struct nl_json *j, const char *key, uint64_t value);
void nl_json_i64(struct nl_json *j, const char *key, int64_t value);
void nl_json_double(struct nl_json *j, const char *key, double value);
void nl_json_bool(struct nl_json *j, const char *key, bool value);
/* Ends the document with a newline. */
void nl_json_end(struct nl_json *j);

#endif
