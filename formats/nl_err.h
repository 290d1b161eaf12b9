/*
 * Error codes and diagnostics shared by every neuralink library.
 *
 * Functions return int: 0 on success, negative on failure. A failure is either
 * -errno passed through unchanged (including io_uring cqe->res) or one of the
 * project codes below, which sit far below any errno value.
 *
 * A failing library function also records a one-line diagnostic for the person
 * who has to fix the problem: the file, the field or tensor, the value found and
 * the value expected, and what to do. It is kept per thread and read with
 * nl_diag_msg(). Libraries never print.
 */
#ifndef NL_ERR_H
#define NL_ERR_H

#include <stdarg.h>

/* Pinned: values never change once released; new codes are appended. */
enum nl_err {
	NL_OK = 0,
	NL_E_INVAL = -4096,     /* bad argument to an API or option value */
	NL_E_FORMAT = -4097,    /* malformed file: a field out of range, inconsistent sizes */
	NL_E_MAGIC = -4098,     /* not a file of the expected kind */
	NL_E_VERSION = -4099,   /* a newer major version than this reader knows */
	NL_E_CHECKSUM = -4100,  /* stored checksum differs from the computed one */
	NL_E_TRUNCATED = -4101, /* file ends before its declared contents */
	NL_E_RESERVED = -4102,  /* a reserved field is not zero */
	NL_E_MISSING = -4103,   /* required dataset, attribute, tensor or key absent */
	NL_E_SHAPE = -4104,     /* dataset or tensor has the wrong shape */
	NL_E_TYPE = -4105,      /* unsupported or unexpected element type */
	NL_E_HDF5 = -4106,      /* the HDF5 library reported an error */
	NL_E_MISMATCH = -4107,  /* two inputs disagree (model identity, shapes) */
	NL_E_UNSUPPORTED = -4108, /* valid but not supported by this build */
	NL_E_COMPRESS = -4109,  /* compression or decompression failed */
	NL_E_EXISTS = -4110,    /* output exists and overwriting was not asked for */
	NL_E_LAST = -4110,
};

/* Text for an error code: project codes and -errno alike. Never NULL. */
const char *nl_strerror(int err);

/*
 * Records a diagnostic for this thread (printf-style) and returns err, so a
 * failure reads `return nl_diag(NL_E_SHAPE, "'%s': ...", path, ...);`.
 */
int nl_diag(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
int nl_vdiag(int err, const char *fmt, va_list ap);

/*
 * Prefixes the current diagnostic with context ("'%s': " style) and returns err;
 * for callers that add the file name to an error raised deeper down.
 */
int nl_diag_prefix(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The last diagnostic recorded on this thread, or "" when none. */
const char *nl_diag_msg(void);
void nl_diag_clear(void);

#endif
