/* server.c -- runs the loop: listen, serve, and drain on SIGTERM/SIGINT. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include <netdb.h>

#include "pilotlight/broker.h"
#include "pilotlight/http.h"
#include "pilotlight/log.h"
#include "pilotlight/server.h"

typedef struct {
    uv_loop_t loop;
    const pl_config *cfg;
    pl_broker *broker;
    pl_http *http;          /* controllers (and dispatch, unless split) */
    pl_http *dispatch_http; /* dispatch_listen, or NULL */
    int draining_https;     /* listeners not yet drained */
    uv_signal_t sigterm, sigint;
    uv_timer_t drain_timer; /* drain delay, then the shutdown deadline */
    int phase;              /* 0 serving, 1 delaying, 2 draining, 3 done */
} server;

static void on_drained(void *arg)
{
    server *s = arg;

    if (s->phase == 3 || --s->draining_https > 0)
        return;
    s->phase = 3;
    PL_LOG(PL_LOG_INFO, "drained", NULL);
    pl_http_stop(s->http);
    if (s->dispatch_http)
        pl_http_stop(s->dispatch_http);
    pl_broker_stop(s->broker);
    uv_close((uv_handle_t *)&s->sigterm, NULL);
    uv_close((uv_handle_t *)&s->sigint, NULL);
    uv_close((uv_handle_t *)&s->drain_timer, NULL);
}

static void on_deadline(uv_timer_t *t)
{
    server *s = t->data;

    PL_LOG(PL_LOG_WARN, "closing every connection now", NULL);
    pl_http_close_all(s->http);
    if (s->dispatch_http)
        pl_http_close_all(s->dispatch_http);
}

static void start_drain(server *s)
{
    s->phase = 2;
    pl_broker_close_parked(s->broker);
    uv_timer_start(&s->drain_timer, on_deadline, s->cfg->shutdown_timeout_ms, 0);
    s->draining_https = s->dispatch_http ? 2 : 1;
    pl_http_drain(s->http, on_drained, s);
    if (s->dispatch_http)
        pl_http_drain(s->dispatch_http, on_drained, s);
}

static void on_delay_over(uv_timer_t *t)
{
    start_drain(t->data);
}

static void on_signal(uv_signal_t *sig, int signum)
{
    server *s = sig->data;

    if (s->phase != 0) {
        if (s->phase < 3) {
            PL_LOG(PL_LOG_WARN, "second signal: closing now", NULL);
            on_deadline(&s->drain_timer);
        }
        return;
    }
    PL_LOG(PL_LOG_INFO, "draining", "\"signal\":\"%s\"", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    pl_broker_set_draining(s->broker);
    if (s->cfg->drain_delay_ms > 0) {
        s->phase = 1;
        uv_timer_start(&s->drain_timer, on_delay_over, s->cfg->drain_delay_ms, 0);
    } else {
        start_drain(s);
    }
}

/* "1.2.3.4:80" or "[::1]:80" for <sa> with <port>, into <out>. */
static void format_address(const struct sockaddr *sa, uint16_t port, char *out, size_t len)
{
    char ip[INET6_ADDRSTRLEN] = "?";

    if (sa->sa_family == AF_INET6) {
        uv_ip6_name((const struct sockaddr_in6 *)(const void *)sa, ip, sizeof(ip));
        snprintf(out, len, "[%s]:%u", ip, port);
    } else {
        uv_ip4_name((const struct sockaddr_in *)(const void *)sa, ip, sizeof(ip));
        snprintf(out, len, "%s:%u", ip, port);
    }
}

static void set_port(struct sockaddr *sa, uint16_t port)
{
    if (sa->sa_family == AF_INET6)
        ((struct sockaddr_in6 *)(void *)sa)->sin6_port = htons(port);
    else
        ((struct sockaddr_in *)(void *)sa)->sin_port = htons(port);
}

/* 1 when an entry of <list> before <ai> has the same address (a hosts
 * file may name one address twice). */
static int seen_before(const struct addrinfo *list, const struct addrinfo *ai)
{
    for (; list != ai; list = list->ai_next) {
        if (list->ai_family != ai->ai_family)
            continue;
        if (ai->ai_family == AF_INET6
                ? memcmp(&((struct sockaddr_in6 *)(void *)list->ai_addr)->sin6_addr,
                         &((struct sockaddr_in6 *)(void *)ai->ai_addr)->sin6_addr, 16) == 0
                : ((struct sockaddr_in *)(void *)list->ai_addr)->sin_addr.s_addr ==
                      ((struct sockaddr_in *)(void *)ai->ai_addr)->sin_addr.s_addr)
            return 1;
    }
    return 0;
}

/* The addresses of <addr>'s host into *list: a numeric host is one
 * address (<one>, in <ss>), a name is resolved now, once, before the loop
 * runs (free the list with uv_freeaddrinfo unless it is <one>). Returns 0
 * or a libuv error. */
static int resolve(server *s, const pl_listen_addr *addr, struct addrinfo *one,
                   struct sockaddr_storage *ss, struct addrinfo **list)
{
    struct addrinfo hints;
    uv_getaddrinfo_t req;
    int rc;

    memset(one, 0, sizeof(*one));
    if (uv_ip4_addr(addr->host, 0, (struct sockaddr_in *)(void *)ss) == 0 ||
        uv_ip6_addr(addr->host, 0, (struct sockaddr_in6 *)(void *)ss) == 0) {
        one->ai_family = ss->ss_family;
        one->ai_addr = (struct sockaddr *)ss;
        *list = one;
        return 0;
    }
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    rc = uv_getaddrinfo(&s->loop, &req, NULL, addr->host, NULL, &hints); /* synchronous */
    *list = rc == 0 ? req.addrinfo : NULL;
    if (rc != 0)
        PL_LOG(PL_LOG_ERROR, "cannot resolve listen address",
               "\"host\":\"%s\",\"error\":\"%s\"", addr->host, uv_strerror(rc));
    return rc;
}

/* Listens on every address of <addr>'s host (see resolve()), all on the
 * same port: with port 0, the one the first bind picked. With several
 * addresses, IPv6 ones are bound IPv6-only so none overlaps an IPv4 one; a
 * lone [::] stays dual-stack (libuv clears IPV6_V6ONLY). An address this
 * host cannot bind (EADDRNOTAVAIL, EAFNOSUPPORT: e.g. ::1 in a container
 * without IPv6) is skipped with a warning. Returns 0 when at least one
 * listens and no other error occurred. */
static int listen_all(server *s, pl_http *h, const pl_listen_addr *addr, const char *role)
{
    struct addrinfo one, *list, *ai;
    struct sockaddr_storage ss;
    uint16_t port = addr->port;
    char where[INET6_ADDRSTRLEN + 8];
    int rc = resolve(s, addr, &one, &ss, &list), bound = 0;

    for (ai = list; ai != NULL && rc == 0; ai = ai->ai_next) {
        if (seen_before(list, ai))
            continue;
        set_port(ai->ai_addr, port);
        rc = pl_http_listen(h, ai->ai_addr,
                            list->ai_next != NULL && ai->ai_family == AF_INET6
                                ? UV_TCP_IPV6ONLY : 0,
                            &port);
        format_address(ai->ai_addr, port, where, sizeof(where));
        if (rc == UV_EADDRNOTAVAIL || rc == UV_EAFNOSUPPORT) {
            PL_LOG(PL_LOG_WARN, "address not available here, skipped",
                   "\"host\":\"%s\",\"address\":\"%s\",\"error\":\"%s\"",
                   addr->host, where, uv_strerror(rc));
            rc = 0;
        } else if (rc == 0) {
            bound++;
            PL_LOG(PL_LOG_INFO, "listening",
                   "\"address\":\"%s\",\"host\":\"%s\",\"serves\":\"%s\","
                   "\"version\":\"" PL_VERSION "\"", where, addr->host, role);
        }
    }
    if (list != &one)
        uv_freeaddrinfo(list);
    if (rc == 0 && bound == 0)
        rc = UV_EADDRNOTAVAIL;
    if (rc != 0)
        PL_LOG(PL_LOG_ERROR, "cannot listen", "\"host\":\"%s\",\"port\":%u,\"error\":\"%s\"",
               addr->host, port, uv_strerror(rc));
    return rc;
}

/* Opens one server context serving <serves> on <addr>. Returns it (not
 * listening when that failed), or NULL when out of memory. */
static pl_http *open_listener(server *s, const pl_listen_addr *addr, unsigned serves)
{
    pl_http_limits limits = {
        .max_connections = s->cfg->max_connections,
        .max_header_bytes = s->cfg->max_header_bytes,
        .max_url_bytes = s->cfg->max_url_bytes,
        .max_body_bytes = s->cfg->max_body_bytes,
        .header_timeout_ms = s->cfg->header_timeout_ms,
        .idle_timeout_ms = s->cfg->idle_timeout_ms,
    };
    pl_http_callbacks cb = {
        .on_request = pl_broker_on_request,
        .on_close = pl_broker_on_close,
        .on_response = pl_broker_on_response,
    };
    const char *role = serves == PL_SERVE_DISPATCH ? "dispatch"
                       : serves == PL_SERVE_CONTROLLERS ? "controllers" : "all";
    pl_http *h = pl_http_new(&s->loop, &limits, &cb, pl_broker_side(s->broker, serves));

    if (h == NULL) {
        PL_LOG(PL_LOG_ERROR, "out of memory at start", NULL);
        return NULL;
    }
    pl_broker_attach(s->broker, h);
    if (listen_all(s, h, addr, role) != 0)
        pl_http_stop(h); /* freed with the others at exit */
    return h;
}

static int start(server *s)
{
    const pl_config *cfg = s->cfg;
    int split = cfg->dispatch_listen.host[0] != '\0';

    s->broker = pl_broker_new(&s->loop, cfg);
    if (s->broker == NULL) {
        PL_LOG(PL_LOG_ERROR, "out of memory at start", NULL);
        return -1;
    }
    s->http = open_listener(s, &cfg->listen, split ? PL_SERVE_CONTROLLERS
                                                   : PL_SERVE_CONTROLLERS | PL_SERVE_DISPATCH);
    if (s->http == NULL || !pl_http_listening(s->http))
        return -1;
    if (split) {
        s->dispatch_http = open_listener(s, &cfg->dispatch_listen, PL_SERVE_DISPATCH);
        if (s->dispatch_http == NULL || !pl_http_listening(s->dispatch_http))
            return -1;
    }
    PL_LOG(PL_LOG_DEBUG, "sizes", "\"connection_bytes\":%zu,\"waiter_bytes\":%zu",
           pl_conn_size(), pl_engine_waiter_size(0));
    uv_signal_init(&s->loop, &s->sigterm);
    uv_signal_init(&s->loop, &s->sigint);
    uv_timer_init(&s->loop, &s->drain_timer);
    s->sigterm.data = s->sigint.data = s->drain_timer.data = s;
    uv_signal_start(&s->sigterm, on_signal, SIGTERM);
    uv_signal_start(&s->sigint, on_signal, SIGINT);
    return 0;
}

static void close_any(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

int pl_server_run(const pl_config *cfg)
{
    server s;
    int rc;

    memset(&s, 0, sizeof(s));
    s.cfg = cfg;
    if (uv_loop_init(&s.loop) != 0)
        return 1;
    rc = start(&s);
    if (rc == 0)
        uv_run(&s.loop, UV_RUN_DEFAULT);
    /* A failed start leaves handles open: close them so the loop can end. */
    uv_walk(&s.loop, close_any, NULL);
    uv_run(&s.loop, UV_RUN_DEFAULT);
    uv_loop_close(&s.loop);
    pl_http_free(s.http);
    pl_http_free(s.dispatch_http);
    pl_broker_free(s.broker);
    PL_LOG(PL_LOG_INFO, "exit", "\"status\":%d", rc == 0 ? 0 : 1);
    return rc == 0 ? 0 : 1;
}
