#include "nl_err.h"

#include <stdio.h>
#include <string.h>

#define NL_DIAG_MAX 2048

static _Thread_local char diag_buf[NL_DIAG_MAX];

const char *nl_strerror(int err)
{
	switch (err) {
	case NL_OK: return "success";
	case NL_E_INVAL: return "invalid argument";
	case NL_E_FORMAT: return "malformed file";
	case NL_E_MAGIC: return "wrong magic: not a file of the expected kind";
	case NL_E_VERSION: return "unsupported (newer) format version";
	case NL_E_CHECKSUM: return "checksum mismatch";
	case NL_E_TRUNCATED: return "file is truncated";
	case NL_E_RESERVED: return "reserved field is not zero";
	case NL_E_MISSING: return "required item is missing";
	case NL_E_SHAPE: return "wrong shape";
	case NL_E_TYPE: return "unsupported element type";
	case NL_E_HDF5: return "HDF5 library error";
	case NL_E_MISMATCH: return "inputs do not match";
	case NL_E_UNSUPPORTED: return "not supported";
	case NL_E_COMPRESS: return "compression error";
	case NL_E_EXISTS: return "output exists";
	}
	if (err < 0 && err > -4096)
		return strerror(-err);
	return "unknown error";
}

int nl_vdiag(int err, const char *fmt, va_list ap)
{
	vsnprintf(diag_buf, sizeof(diag_buf), fmt, ap);
	return err;
}

int nl_diag(int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	nl_vdiag(err, fmt, ap);
	va_end(ap);
	return err;
}

int nl_diag_prefix(int err, const char *fmt, ...)
{
	char prefix[512], old[NL_DIAG_MAX];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(prefix, sizeof(prefix), fmt, ap);
	va_end(ap);
	memcpy(old, diag_buf, sizeof(old));
	snprintf(diag_buf, sizeof(diag_buf), "%s%s", prefix, old[0] ? old : nl_strerror(err));
	return err;
}

const char *nl_diag_msg(void)
{
	return diag_buf;
}

void nl_diag_clear(void)
{
	diag_buf[0] = '\0';
}
