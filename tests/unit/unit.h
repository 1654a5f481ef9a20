/* unit.h -- a tiny test harness: CHECK macros that count failures.
 *
 * A failed check prints file:line and what failed, then the test goes on.
 * Each test is a void function run with RUN(); main returns unit_finish(),
 * which is non-zero when any check failed. */
#ifndef PILOTLIGHT_UNIT_H
#define PILOTLIGHT_UNIT_H

#include <errno.h>
#include <stdio.h>
#include <string.h>

static unsigned long unit_checks;
static unsigned long unit_failures;

#define CHECK(cond)                                                       \
    do {                                                                  \
        unit_checks++;                                                    \
        if (!(cond)) {                                                    \
            unit_failures++;                                              \
            fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__,        \
                    __LINE__, #cond);                                     \
        }                                                                 \
    } while (0)

/* Integer equality, printing both values (as signed and unsigned 64-bit
 * so that negative error codes and large counters both read well). */
#define CHECK_EQ(a, b)                                                    \
    do {                                                                  \
        unsigned long long unit_a_ = (unsigned long long)(a);             \
        unsigned long long unit_b_ = (unsigned long long)(b);             \
        unit_checks++;                                                    \
        if (unit_a_ != unit_b_) {                                         \
            unit_failures++;                                              \
            fprintf(stderr, "%s:%d: CHECK_EQ failed: %s == %s (%lld vs %lld)\n", \
                    __FILE__, __LINE__, #a, #b, (long long)unit_a_,       \
                    (long long)unit_b_);                                  \
        }                                                                 \
    } while (0)

#define CHECK_STR(a, b)                                                   \
    do {                                                                  \
        const char *unit_a_ = (a), *unit_b_ = (b);                        \
        unit_checks++;                                                    \
        if (unit_a_ == NULL || unit_b_ == NULL ||                         \
            strcmp(unit_a_, unit_b_) != 0) {                              \
            unit_failures++;                                              \
            fprintf(stderr, "%s:%d: CHECK_STR failed: %s == %s (\"%s\" vs \"%s\")\n", \
                    __FILE__, __LINE__, #a, #b,                           \
                    unit_a_ ? unit_a_ : "(null)",                         \
                    unit_b_ ? unit_b_ : "(null)");                        \
        }                                                                 \
    } while (0)

/* Runs one test function and says whether it passed. */
#define RUN(fn)                                                           \
    do {                                                                  \
        unsigned long unit_before_ = unit_failures;                       \
        fn();                                                             \
        printf("%s %s\n", unit_failures == unit_before_ ? "ok  " : "FAIL", \
               #fn);                                                      \
        fflush(stdout);                                                   \
    } while (0)

/* Prints the totals; returns the process exit status. */
static inline int unit_finish(void)
{
    printf("%lu checks, %lu failed\n", unit_checks, unit_failures);
    return unit_failures ? 1 : 0;
}

#endif
