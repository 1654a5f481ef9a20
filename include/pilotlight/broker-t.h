/* broker-t.h -- the broker's types: what a dispatch came to. */
#ifndef PILOTLIGHT_BROKER_T_H
#define PILOTLIGHT_BROKER_T_H

/* What a dispatch came to. Order is the order of the metrics labels. */
typedef enum {
    PL_DISPATCH_HIT = 0,     /* true */
    PL_DISPATCH_MISS,        /* false: no poll took it, or none could have it
                              * whole */
    PL_DISPATCH_INVALID,     /* 400 */
    PL_DISPATCH_ABANDONED,   /* its dispatcher had gone before the run was
                              * handed to a controller: offered to nobody */
    PL_DISPATCH_UNCONFIRMED, /* false although the last controller tried may
                              * have it: TCP could not tell (delivery = confirm;
                              * docs/delivery.md) */
    PL_DISPATCH_OFF,         /* false at once: warm_starts = off */
    PL_DISPATCH__COUNT
} pl_dispatch_result;

#endif
