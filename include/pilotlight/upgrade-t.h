/* upgrade-t.h -- the binary upgrade's types: how one ended. */
#ifndef PILOTLIGHT_UPGRADE_T_H
#define PILOTLIGHT_UPGRADE_T_H

/* How a binary upgrade (SIGUSR2) ended, seen from the process upgraded.
 * Order is the order of the metrics labels. */
typedef enum {
    PL_UPGRADE_HANDED_OVER = 0, /* the new process took everything over */
    PL_UPGRADE_FAILED,          /* it could not start, exited or refused */
    PL_UPGRADE_TIMEOUT,         /* it missed a step's bound: killed */
    PL_UPGRADE_ABORTED,         /* SIGTERM or SIGINT came first: killed */
    PL_UPGRADE__COUNT
} pl_upgrade_result;

#endif
