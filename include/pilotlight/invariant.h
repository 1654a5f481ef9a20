/* invariant.h -- invariants checked in every build, release included.
 *
 * For conditions whose breaking would misdeliver a run or corrupt the
 * engine's state (a waiter settled twice, a ledger that no longer adds up):
 * carrying on would be worse than stopping, so the process reports the
 * condition and aborts. Not for errors a request or the system can cause:
 * those are handled where they happen. */
#ifndef PILOTLIGHT_INVARIANT_H
#define PILOTLIGHT_INVARIANT_H

/* Writes one JSON line naming <file>:<line> and <cond> to stderr, then
 * aborts. */
void pl_invariant_failed(const char *file, int line, const char *cond)
    __attribute__((noreturn, cold));

#define PL_ASSERT(cond)                                         \
    do {                                                        \
        if (__builtin_expect(!(cond), 0))                       \
            pl_invariant_failed(__FILE__, __LINE__, #cond);     \
    } while (0)

#endif
