/* routes.c -- which handler answers a request (path, method, listener,
 * bearer token), and the small endpoints. */
#include <string.h>
#include <strings.h>

#include <llhttp.h>
#include <openssl/crypto.h>

#include "pilotlight/broker.h"
#include "pilotlight/cluster.h"
#include "pilotlight/redirect.h"
#include "pilotlight/routes.h"

static void handle_connect(pl_broker *b, pl_conn *c, const pl_request *req, const pl_hop *hop)
{
    size_t len;
    const char *body = pl_broker_connect_body(b, &len);

    (void)req, (void)hop;
    pl_conn_respond(c, 200, "application/json", NULL, body, len);
}

static void handle_healthz(pl_broker *b, pl_conn *c, const pl_request *req, const pl_hop *hop)
{
    (void)b, (void)req, (void)hop;
    pl_conn_respond_json(c, 200, "{\"status\":\"ok\"}");
}

/* GET /readyz: also a ring member's check, which carries the checker's
 * view and is answered with this one's (redirect.h). */
static void handle_readyz(pl_broker *b, pl_conn *c, const pl_request *req, const pl_hop *hop)
{
    char view[PL_RING_NAME_MAX + 64];
    size_t n = pl_redirect_view_header(pl_broker_ring(b), view, sizeof(view));
    int draining = pl_broker_draining(b);

    (void)hop;
    if (req->header[PL_HDR_RING] != NULL)
        pl_redirect_heard(pl_broker_ring(b), req->header[PL_HDR_RING],
                          req->header_len[PL_HDR_RING]);
    pl_conn_respond(c, draining ? 503 : 200, "application/json", n > 0 ? view : NULL,
                    draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ready\"}",
                    draining ? 21 : 18);
}

static void handle_metrics(pl_broker *b, pl_conn *c, const pl_request *req, const pl_hop *hop)
{
    (void)req, (void)hop;
    pl_status_metrics(pl_broker_status(b), c);
}

/* GET /debug/waiters: what is parked, per key; no payloads. */
static void handle_debug_waiters(pl_broker *b, pl_conn *c, const pl_request *req,
                                 const pl_hop *hop)
{
    (void)req, (void)hop;
    pl_status_waiters(pl_broker_status(b), c);
}

/* GET /status: the page; GET /debug/status: what it shows, as JSON. */
static void handle_status(pl_broker *b, pl_conn *c, const pl_request *req, const pl_hop *hop)
{
    (void)req, (void)hop;
    pl_status_page(pl_broker_status(b), c, pl_broker_draining(b));
}

static void handle_debug_status(pl_broker *b, pl_conn *c, const pl_request *req,
                                const pl_hop *hop)
{
    (void)req, (void)hop;
    pl_status_json(pl_broker_status(b), c, pl_broker_draining(b));
}

typedef void (*handler)(pl_broker *b, pl_conn *c, const pl_request *req, const pl_hop *hop);

/* What a route asks of a request beyond its path and method. */
enum {
    BEARER = 1, /* dispatch_token, when one is set */
    ALLOW = 2,  /* an address dispatch_allow names, when it is set */
};

static const struct route {
    const char *path;
    int method;      /* HTTP_GET also takes HEAD */
    pl_route tag;
    unsigned serves; /* PL_SERVE_* */
    unsigned asks;   /* BEARER, ALLOW */
    handler fn;
} routes[] = {
    {"/warm-start", HTTP_GET, PL_ROUTE_PARK, PL_SERVE_CONTROLLERS, 0, pl_broker_park},
    {"/warm-start", HTTP_POST, PL_ROUTE_DISPATCH, PL_SERVE_DISPATCH, BEARER | ALLOW,
     pl_broker_dispatch},
    {"/connect", HTTP_GET, PL_ROUTE_CONNECT, PL_SERVE_CONTROLLERS, 0, handle_connect},
    {"/healthz", HTTP_GET, PL_ROUTE_HEALTHZ, PL_SERVE_CONTROLLERS | PL_SERVE_DISPATCH, 0,
     handle_healthz},
    {"/readyz", HTTP_GET, PL_ROUTE_READYZ, PL_SERVE_CONTROLLERS | PL_SERVE_DISPATCH, 0,
     handle_readyz},
    {"/metrics", HTTP_GET, PL_ROUTE_METRICS, PL_SERVE_DISPATCH, ALLOW, handle_metrics},
    {"/debug/waiters", HTTP_GET, PL_ROUTE_DEBUG, PL_SERVE_DISPATCH, BEARER | ALLOW,
     handle_debug_waiters},
    {"/status", HTTP_GET, PL_ROUTE_STATUS, PL_SERVE_DISPATCH, BEARER | ALLOW, handle_status},
    {"/debug/status", HTTP_GET, PL_ROUTE_STATUS, PL_SERVE_DISPATCH, BEARER | ALLOW,
     handle_debug_status},
};

#define NROUTES (sizeof(routes) / sizeof(routes[0]))

static int path_is(const pl_request *req, const char *path)
{
    size_t len = strlen(path);
    return req->path_len == len && memcmp(req->path, path, len) == 0;
}

/* Compares "Bearer <token>" with dispatch_token in constant time. */
static int bearer_ok(const pl_config *cfg, const pl_request *req)
{
    const char *want = cfg->dispatch_token, *got = req->header[PL_HDR_AUTHORIZATION];
    size_t wlen = strlen(want), glen = req->header_len[PL_HDR_AUTHORIZATION];

    if (got == NULL || glen != wlen + 7 || strncasecmp(got, "Bearer ", 7) != 0)
        return 0;
    return CRYPTO_memcmp(got + 7, want, wlen) == 0;
}

/* Whether <c>'s peer is one dispatch_allow names (anyone, when it is
 * empty). A system call, on the routes that ask it only. */
static int address_allowed(const pl_config *cfg, const pl_conn *c)
{
    struct sockaddr_storage ss;

    if (cfg->dispatch_allow_nets.n == 0)
        return 1;
    return pl_conn_peer_address(c, &ss) == 0 &&
           pl_cidr_match(&cfg->dispatch_allow_nets, (struct sockaddr *)&ss);
}

/* A dispatch redirected by another instance of the ring comes without its
 * Authorization header (a client drops it on a redirect to another host),
 * signed instead (redirect.h). Admitted so, it is never sent on again. */
static int signed_redirect(pl_broker *b, const pl_request *req, pl_hop *hop)
{
    if (!pl_redirect_signed(pl_broker_ring(b), req, hop, "/warm-start"))
        return 0;
    hop->signed_only = 1;
    return 1;
}

static void reply_405(pl_conn *c, const pl_request *req)
{
    int post = 0;

    for (size_t i = 0; i < NROUTES; i++)
        if (path_is(req, routes[i].path) && routes[i].method == HTTP_POST)
            post = 1;
    pl_conn_respond(c, 405, "application/json",
                    post ? "Allow: GET, POST\r\n" : "Allow: GET, HEAD\r\n",
                    "{\"error\":\"method not allowed\"}", 30);
}

void pl_routes_on_request(void *app, pl_conn *c, const pl_request *req)
{
    const pl_broker_view *v = app;
    const pl_config *cfg = pl_broker_config(v->broker);
    int method = req->method == HTTP_HEAD ? HTTP_GET : req->method, known = 0;
    pl_hop hop = {0};

    /* Read once, here: the bearer check and the key ring both use it. */
    if (req->query_len > 0)
        pl_cluster_read_hop(req->query, req->query_len, &hop);

    for (size_t i = 0; i < NROUTES; i++) {
        const struct route *r = &routes[i];
        if (!path_is(req, r->path))
            continue;
        known = 1;
        if (r->method != method || (req->method == HTTP_HEAD && r->fn == pl_broker_park))
            continue;
        pl_conn_set_tag(c, r->tag);
        if (!(r->serves & v->serves)) {
            pl_conn_respond_error(c, 403, "not served on this listener");
        } else if ((r->asks & ALLOW) && !address_allowed(cfg, c)) {
            pl_broker_metrics(v->broker)->forbidden++;
            pl_conn_respond_error(c, 403, "not allowed from this address (dispatch_allow)");
        } else if ((r->asks & BEARER) && cfg->dispatch_token[0] != '\0' && !bearer_ok(cfg, req) &&
                   !(r->tag == PL_ROUTE_DISPATCH && signed_redirect(v->broker, req, &hop))) {
            pl_conn_respond(c, 401, "application/json", "WWW-Authenticate: Bearer\r\n",
                            "{\"error\":\"missing or wrong bearer token\"}", 41);
        } else {
            r->fn(v->broker, c, req, &hop);
        }
        return;
    }
    if (known)
        reply_405(c, req);
    else
        pl_conn_respond_error(c, 404, "not found");
}

void pl_routes_on_response(void *app, unsigned tag, int status)
{
    const pl_broker_view *v = app;

    if (tag < PL_ROUTE__COUNT)
        pl_metrics_count_http(pl_broker_metrics(v->broker), (pl_route)tag, status);
}
