/* routes.h -- the request table: which handler answers a request, by path,
 * method, the listener it came in on and the bearer token, and the small
 * endpoints (/connect, /healthz, /readyz, /metrics, /debug/waiters,
 * /status, /debug/status). */
#ifndef PILOTLIGHT_ROUTES_H
#define PILOTLIGHT_ROUTES_H

#include "pilotlight/http.h"
#include "pilotlight/routes-t.h"

/* pl_http callbacks; <app> is a pl_broker_view_of() pointer. Unknown paths
 * get 404, known ones with another method 405 with Allow, a route not
 * served on this listener 403, a missing or wrong bearer token 401. */
void pl_routes_on_request(void *app, pl_conn *c, const pl_request *req);
void pl_routes_on_response(void *app, unsigned tag, int status);

#endif
