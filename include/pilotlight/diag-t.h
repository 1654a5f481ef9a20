/* diag-t.h -- the diagnosis's types: what was parked nearest to the key of
 * a dispatch that missed. */
#ifndef PILOTLIGHT_DIAG_T_H
#define PILOTLIGHT_DIAG_T_H

/* The nearest thing to a missed dispatch's key, the first that holds in
 * this order. Order is the order of the metrics labels. */
typedef enum {
    PL_NEAREST_KEY = 0,    /* polls were parked for the key itself, and none
                            * could take the run (their connections had gone,
                            * or their controllers were about to give up) */
    PL_NEAREST_TOKEN,      /* a poll for the key, or for its deployment with
                            * nothing else of it parked, was lately refused
                            * its deployment token (or found it invalid) */
    PL_NEAREST_MACHINE,    /* the deployment and version are parked, on
                            * another machine size */
    PL_NEAREST_VERSION,    /* the deployment is parked, on another version */
    PL_NEAREST_DEPLOYMENT, /* nothing for the deployment; others are parked */
    PL_NEAREST_NONE,       /* nothing parked at all */
    PL_NEAREST__COUNT
} pl_nearest;

#endif
