/* log.c -- one JSON object per line on stderr. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "pilotlight/log.h"

pl_log_level pl_log_threshold = PL_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

size_t pl_log_escape(char *out, size_t cap, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        char esc[7];
        size_t n = 0;

        if (c == '"' || c == '\\') {
            esc[n++] = '\\';
            esc[n++] = (char)c;
        } else if (c < 0x20 || c == 0x7f) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            n = 6;
        } else {
            esc[n++] = (char)c;
        }
        if (o + n >= cap)
            break;
        memcpy(out + o, esc, n);
        o += n;
    }
    if (cap > 0)
        out[o] = '\0';
    return o;
}

void pl_log_write(pl_log_level level, const char *msg, const char *fields, ...)
{
    char line[2048], emsg[512], ts[32];
    struct timespec now;
    struct tm tm;
    int n;

    clock_gettime(CLOCK_REALTIME, &now);
    gmtime_r(&now.tv_sec, &tm);
    strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    pl_log_escape(emsg, sizeof(emsg), msg, strlen(msg));
    n = snprintf(line, sizeof(line), "{\"ts\":\"%s.%03ldZ\",\"level\":\"%s\",\"msg\":\"%s\"",
                 ts, now.tv_nsec / 1000000, level_names[level], emsg);
    if (fields != NULL && n > 0 && (size_t)n < sizeof(line) - 1) {
        va_list ap;
        line[n++] = ',';
        va_start(ap, fields);
        n += vsnprintf(line + n, sizeof(line) - (size_t)n, fields, ap);
        va_end(ap);
    }
    if (n < 0)
        return;
    if ((size_t)n > sizeof(line) - 3)
        n = (int)sizeof(line) - 3; /* truncated: still close the object */
    line[n++] = '}';
    line[n++] = '\n';
    fwrite(line, 1, (size_t)n, stderr);
}
