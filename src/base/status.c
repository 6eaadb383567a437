/* The thread's error detail: what fa_last_error() returns after a failed call. */
#include "config.h"

#include <stdarg.h>
#include <stdio.h>

#include "base/base.h"

static _Thread_local char last_error[512];

fa_status fai_fail(fa_status s, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return s;
}

const char *fai_last_error_text(void) { return last_error; }
