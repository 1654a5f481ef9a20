/* server.c -- runs the loop: listen, serve, and drain on SIGTERM/SIGINT. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "pilotlight/broker.h"
#include "pilotlight/http.h"
#include "pilotlight/log.h"
#include "pilotlight/pool.h"
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

/* Opens one listener serving <serves> on <addr>. Returns it, or NULL. */
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
    uint16_t port;
    int rc;

    if (h == NULL) {
        PL_LOG(PL_LOG_ERROR, "out of memory at start", NULL);
        return NULL;
    }
    pl_broker_attach(s->broker, h);
    rc = pl_http_listen(h, addr->host, addr->port, &port);
    if (rc != 0) {
        PL_LOG(PL_LOG_ERROR, "cannot listen", "\"host\":\"%s\",\"port\":%u,\"error\":\"%s\"",
               addr->host, addr->port, uv_strerror(rc));
        pl_http_stop(h);
        return h; /* freed with the others at exit */
    }
    PL_LOG(PL_LOG_INFO, "listening", strchr(addr->host, ':')
               ? "\"address\":\"[%s]:%u\",\"serves\":\"%s\",\"version\":\"" PL_VERSION "\""
               : "\"address\":\"%s:%u\",\"serves\":\"%s\",\"version\":\"" PL_VERSION "\"",
           addr->host, port, role);
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
    /* Pooled objects are out of the leak checkers' sight: one still handed
     * out now is a leak, and fails the run as valgrind would. */
    if (pl_pool_in_use_total() != 0) {
        PL_LOG(PL_LOG_ERROR, "pooled objects leaked", "\"objects\":%llu",
               (unsigned long long)pl_pool_in_use_total());
        rc = 1;
    }
    PL_LOG(PL_LOG_INFO, "exit", "\"status\":%d", rc == 0 ? 0 : 1);
    return rc == 0 ? 0 : 1;
}
