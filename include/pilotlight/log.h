/* log.h -- JSON-lines logging on stderr, level checked before formatting. */
#ifndef PILOTLIGHT_LOG_H
#define PILOTLIGHT_LOG_H

#include <stddef.h>

typedef enum { PL_LOG_ERROR = 0, PL_LOG_WARN, PL_LOG_INFO, PL_LOG_DEBUG } pl_log_level;

extern pl_log_level pl_log_threshold;

/* Logs one line: {"ts":…,"level":…,"msg":<msg>} plus <fields>, a printf
 * format producing further `"name":value` members (may be NULL). Callers use
 * PL_LOG so that nothing is formatted for a level that is off. */
void pl_log_write(pl_log_level level, const char *msg, const char *fields, ...)
    __attribute__((format(printf, 3, 4)));

#define PL_LOG(level, ...)                     \
    do {                                       \
        if ((level) <= pl_log_threshold)       \
            pl_log_write((level), __VA_ARGS__); \
    } while (0)

/* Writes <s> (<len> bytes) as the inside of a JSON string into <out> (<cap>
 * bytes, always NUL-terminated, truncated to fit): controls escaped, bytes
 * that are not UTF-8 replaced by U+FFFD. Returns the length written. */
size_t pl_log_escape(char *out, size_t cap, const char *s, size_t len);

struct sockaddr;

/* "1.2.3.4:80" or "[::1]:80" for the address of <sa> with <port>, into
 * <out> ("?" for the address when it cannot be read). */
void pl_log_address(char *out, size_t cap, const struct sockaddr *sa, unsigned port);

#endif
