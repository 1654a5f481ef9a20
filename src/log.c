/* log.c -- one JSON object per line on stderr. */
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "pilotlight/log.h"
#include "pilotlight/utf8.h"

pl_log_level pl_log_threshold = PL_LOG_INFO;

static const char *const level_names[] = {"error", "warn", "info", "debug"};

size_t pl_log_escape(char *out, size_t cap, const char *s, size_t len)
{
    static const char hex[] = "0123456789abcdef";
    size_t o = 0;

    for (size_t i = 0; i < len;) {
        unsigned char c = (unsigned char)s[i];
        const char *src = s + i;
        char esc[7];
        size_t n = 1, step = 1;

        if (c == '"' || c == '\\') {
            esc[0] = '\\';
            esc[1] = (char)c;
            src = esc;
            n = 2;
        } else if (c < 0x20 || c == 0x7f) {
            memcpy(esc, "\\u00", 4);
            esc[4] = hex[c >> 4];
            esc[5] = hex[c & 15];
            src = esc;
            n = 6;
        } else if (c >= 0x80) {
            /* valid UTF-8 passes; any other byte becomes U+FFFD, so the
             * output is valid JSON whatever a client sent */
            step = n = pl_utf8_len((const unsigned char *)s + i, len - i);
            if (n == 0) {
                src = "\\ufffd";
                n = 6;
                step = 1;
            }
        }
        if (o + n >= cap)
            break;
        memcpy(out + o, src, n);
        o += n;
        i += step;
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

void pl_log_address(char *out, size_t cap, const struct sockaddr *sa, unsigned port)
{
    char ip[INET6_ADDRSTRLEN] = "?";

    if (sa->sa_family == AF_INET6) {
        inet_ntop(AF_INET6, &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr, ip,
                  sizeof(ip));
        snprintf(out, cap, "[%s]:%u", ip, port);
    } else {
        if (sa->sa_family == AF_INET)
            inet_ntop(AF_INET, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, ip,
                      sizeof(ip));
        snprintf(out, cap, "%s:%u", ip, port);
    }
}
