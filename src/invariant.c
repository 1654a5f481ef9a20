/* invariant.c -- a broken invariant: say which, then stop. */
#include <stdio.h>
#include <stdlib.h>

#include "pilotlight/invariant.h"

void pl_invariant_failed(const char *file, int line, const char *cond)
{
    /* No formatting helpers of our own: the state they use may be what
     * broke. The condition is source text: no quote or control in it. */
    fprintf(stderr, "{\"level\":\"error\",\"msg\":\"invariant broken\",\"where\":\"%s:%d\","
                    "\"condition\":\"%s\"}\n", file, line, cond);
    fflush(stderr);
    abort();
}
