/* routes-t.h -- the routes' types: what a request was, for the counters. */
#ifndef PILOTLIGHT_ROUTES_T_H
#define PILOTLIGHT_ROUTES_T_H

/* The route a request took, tagged on its connection (pl_conn_set_tag) so
 * its answer is counted under it. Order is the order of the metrics labels. */
typedef enum {
    PL_ROUTE_OTHER = 0,
    PL_ROUTE_CONNECT,
    PL_ROUTE_PARK,
    PL_ROUTE_DISPATCH,
    PL_ROUTE_HEALTHZ,
    PL_ROUTE_READYZ,
    PL_ROUTE_METRICS,
    PL_ROUTE_DEBUG,
    PL_ROUTE_STATUS, /* /status and /debug/status */
    PL_ROUTE__COUNT
} pl_route;

#endif
