/* metrics.c -- Prometheus text exposition of the broker's counters. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "pilotlight/diag.h"
#include "pilotlight/metrics.h"
#include "pilotlight/pool.h"

static const double dispatch_bounds[] = {
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
    0.0025, 0.005, 0.01, 0.025, 0.1, 1,
};
static const double wait_bounds[] = {
    0.001, 0.01, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600,
};

static const double ack_bounds[] = {
    0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001,
    0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1,
};

static const char *const confirm_method_names[PL_CONFIRM_BY__COUNT] = {
    "ack_event", "poll_fallback", "next_request", "next_turn", "late_check",
};
static const char *const confirm_names[PL_CONFIRM__COUNT] = {
    "acked", "unsent", "closed_unread", "unacknowledged", "reset_after_send", "redelivered",
};
/* From well under a scheduler tick to a stall nobody should tolerate. */
static const double lag_bounds[] = {
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
    0.025, 0.05, 0.1, 0.25, 0.5, 1,
};

static const char *const upgrade_names[PL_UPGRADE__COUNT] = {
    "handed_over", "failed", "timeout", "aborted",
};

static const char *const route_names[PL_ROUTE__COUNT] = {
    "other", "connect", "park", "dispatch", "healthz", "readyz", "metrics", "debug", "status",
};
static const char *const result_names[PL_DISPATCH__COUNT] = {
    "hit", "miss", "invalid", "abandoned", "unconfirmed", "off",
};
static const char *const token_names[4] = {"valid", "invalid", "legacy", "absent"};

void pl_metrics_init(pl_metrics *m)
{
    memset(m, 0, sizeof(*m));
    m->dispatch_seconds.bounds = dispatch_bounds;
    m->dispatch_seconds.nbounds = sizeof(dispatch_bounds) / sizeof(double);
    m->wait_seconds.bounds = wait_bounds;
    m->wait_seconds.nbounds = sizeof(wait_bounds) / sizeof(double);
    m->confirm.ack_seconds.bounds = ack_bounds;
    m->confirm.ack_seconds.nbounds = sizeof(ack_bounds) / sizeof(double);
    m->loop_lag.bounds = lag_bounds;
    m->loop_lag.nbounds = sizeof(lag_bounds) / sizeof(double);
}

typedef struct {
    char *buf;
    size_t cap, len;
    int overflow;
} out_t;

static void emit(out_t *o, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void emit(out_t *o, const char *fmt, ...)
{
    va_list ap;
    int n;

    if (o->overflow)
        return;
    va_start(ap, fmt);
    n = vsnprintf(o->buf + o->len, o->cap - o->len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= o->cap - o->len)
        o->overflow = 1;
    else
        o->len += (size_t)n;
}

static void emit_histogram(out_t *o, const char *name, const char *help,
                           const pl_histogram *h)
{
    uint64_t cum = 0;

    emit(o, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    for (size_t i = 0; i < h->nbounds; i++) {
        cum += h->counts[i];
        emit(o, "%s_bucket{le=\"%g\"} %llu\n", name, h->bounds[i], (unsigned long long)cum);
    }
    emit(o, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.9g\n%s_count %llu\n", name,
         (unsigned long long)h->count, name, h->sum, name, (unsigned long long)h->count);
}

static const struct {
    const char *name, *type, *help;
} pool_families[] = {
    {"pilotlight_pool_reserved_bytes", "gauge", "Bytes a memory pool holds from the system."},
    {"pilotlight_pool_objects_in_use", "gauge", "Objects handed out from a memory pool."},
    {"pilotlight_pool_chunks_allocated_total", "counter",
     "Chunks a memory pool took from the system."},
    {"pilotlight_pool_chunks_returned_total", "counter",
     "Chunks a memory pool gave back to the system."},
};

typedef struct {
    out_t *o;
    size_t family;
} pool_out;

static void emit_pool(const pl_pool *p, void *arg)
{
    pool_out *po = arg;
    unsigned long long v[] = {pl_pool_reserved_bytes(p), p->in_use, p->chunks_allocated,
                              p->chunks_returned};

    emit(po->o, "%s{pool=\"%s\"} %llu\n", pool_families[po->family].name, p->name,
         v[po->family]);
}

static void emit_pools(out_t *o)
{
    for (size_t f = 0; f < sizeof(pool_families) / sizeof(pool_families[0]); f++) {
        pool_out po = {o, f};
        emit(o, "# HELP %s %s\n# TYPE %s %s\n", pool_families[f].name, pool_families[f].help,
             pool_families[f].name, pool_families[f].type);
        pl_pool_each(emit_pool, &po);
    }
}

/* The standard process collector's names and units. */
static void emit_process(out_t *o, const pl_proc_stats *p)
{
    emit(o, "# HELP process_cpu_seconds_total Total user and system CPU time spent in seconds.\n"
            "# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total %.9g\n",
         p->cpu_seconds);
    emit(o, "# HELP process_resident_memory_bytes Resident memory size in bytes.\n"
            "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes %llu\n",
         (unsigned long long)p->resident_bytes);
    emit(o, "# HELP process_virtual_memory_bytes Virtual memory size in bytes.\n"
            "# TYPE process_virtual_memory_bytes gauge\nprocess_virtual_memory_bytes %llu\n",
         (unsigned long long)p->virtual_bytes);
    emit(o, "# HELP process_open_fds Number of open file descriptors.\n"
            "# TYPE process_open_fds gauge\nprocess_open_fds %llu\n",
         (unsigned long long)p->open_fds);
    if (p->max_fds > 0)
        emit(o, "# HELP process_max_fds Maximum number of open file descriptors.\n"
                "# TYPE process_max_fds gauge\nprocess_max_fds %llu\n",
             (unsigned long long)p->max_fds);
    emit(o, "# HELP process_start_time_seconds Start time of the process since unix epoch in seconds.\n"
            "# TYPE process_start_time_seconds gauge\nprocess_start_time_seconds %.3f\n",
         p->start_time_seconds);
}

/* A counter of the ring's with one series per route: polls, dispatches. */
static void by_route(out_t *o, const char *name, const char *help, const uint64_t v[2])
{
    static const char *const routes[2] = {"poll", "dispatch"};

    emit(o, "# HELP %s %s\n# TYPE %s counter\n", name, help, name);
    for (int i = 0; i < 2; i++)
        emit(o, "%s{route=\"%s\"} %llu\n", name, routes[i], (unsigned long long)v[i]);
}

/* The key ring's metrics, when there is one. */
static void emit_ring(out_t *o, const pl_metrics *m)
{
    emit(o, "# HELP pilotlight_ring_members Instances of the key ring as this one sees "
            "it, itself included (0 once it has left to drain).\n"
            "# TYPE pilotlight_ring_members gauge\n"
            "pilotlight_ring_members %llu\n"
            "# HELP pilotlight_ring_changes_total Times this instance's view of the ring "
            "changed.\n"
            "# TYPE pilotlight_ring_changes_total counter\n"
            "pilotlight_ring_changes_total %llu\n",
         (unsigned long long)m->ring_members, (unsigned long long)m->ring_changes);
    emit(o, "# HELP pilotlight_ring_agreed 1 when every member up reports the view this "
            "instance has, else 0.\n# TYPE pilotlight_ring_agreed gauge\n"
            "pilotlight_ring_agreed %llu\n"
            "# HELP pilotlight_ring_clock_skew_seconds The largest difference between this "
            "instance's wall clock and a member's, as their checks' answers show it.\n"
            "# TYPE pilotlight_ring_clock_skew_seconds gauge\n"
            "pilotlight_ring_clock_skew_seconds %.3f\n",
         (unsigned long long)m->ring_agreed, (double)m->ring_clock_skew_ms / 1000.0);
    by_route(o, "pilotlight_ring_redirects_total",
             "Requests answered 307 to the instance that owns their key.", m->ring_redirects);
    by_route(o, "pilotlight_ring_hop_served_total",
             "Redirected requests served here although another instance owns their key "
             "(views of the ring disagreed).", m->ring_hop_served);
}

size_t pl_metrics_render(const pl_metrics *m, const pl_ledger *l, size_t keys,
                         char *buf, size_t cap)
{
    out_t o = {buf, cap, 0, 0};

    emit(&o, "# HELP pilotlight_parked_now Polls parked now.\n"
             "# TYPE pilotlight_parked_now gauge\npilotlight_parked_now %llu\n",
         (unsigned long long)l->parked_now);
    emit(&o, "# HELP pilotlight_keys_now Distinct keys with a parked poll.\n"
             "# TYPE pilotlight_keys_now gauge\npilotlight_keys_now %zu\n", keys);
    emit(&o, "# HELP pilotlight_parked_total Polls that reached the engine, rejected ones included.\n"
             "# TYPE pilotlight_parked_total counter\npilotlight_parked_total %llu\n",
         (unsigned long long)l->parked_total);
    emit(&o, "# HELP pilotlight_settled_total Polls ended, by outcome.\n"
             "# TYPE pilotlight_settled_total counter\n");
    for (int i = 0; i < PL_OUTCOME__COUNT; i++)
        emit(&o, "pilotlight_settled_total{outcome=\"%s\"} %llu\n",
             pl_outcome_name((pl_outcome)i), (unsigned long long)l->settled[i]);
    emit(&o, "# HELP pilotlight_dispatch_total Dispatches, by result.\n"
             "# TYPE pilotlight_dispatch_total counter\n");
    for (int i = 0; i < PL_DISPATCH__COUNT; i++)
        emit(&o, "pilotlight_dispatch_total{result=\"%s\"} %llu\n", result_names[i],
             (unsigned long long)m->dispatch[i]);
    emit(&o, "# HELP pilotlight_dispatch_miss_total Dispatches nobody parked for their key "
             "took (result miss), by what was parked nearest it.\n"
             "# TYPE pilotlight_dispatch_miss_total counter\n");
    for (int i = 0; i < PL_NEAREST__COUNT; i++)
        emit(&o, "pilotlight_dispatch_miss_total{nearest=\"%s\"} %llu\n",
             pl_nearest_name((pl_nearest)i), (unsigned long long)m->miss_nearest[i]);
    emit(&o, "# HELP pilotlight_token_checks_total Deployment tokens checked, by result.\n"
             "# TYPE pilotlight_token_checks_total counter\n");
    for (int i = 0; i < 4; i++)
        emit(&o, "pilotlight_token_checks_total{result=\"%s\"} %llu\n", token_names[i],
             (unsigned long long)m->token[i]);
    emit(&o, "# HELP pilotlight_http_requests_total HTTP responses, by route and status class.\n"
             "# TYPE pilotlight_http_requests_total counter\n");
    for (int r = 0; r < PL_ROUTE__COUNT; r++)
        for (int c = 0; c < 5; c++)
            emit(&o, "pilotlight_http_requests_total{route=\"%s\",class=\"%dxx\"} %llu\n",
                 route_names[r], c + 1, (unsigned long long)m->http[r][c]);
    emit(&o, "# HELP pilotlight_connections_open Open client connections.\n"
             "# TYPE pilotlight_connections_open gauge\npilotlight_connections_open %llu\n",
         (unsigned long long)m->connections_open);
    emit_histogram(&o, "pilotlight_dispatch_duration_seconds",
                   "Time to handle a dispatch, body received to answer queued.",
                   &m->dispatch_seconds);
    emit_histogram(&o, "pilotlight_wait_duration_seconds",
                   "How long matched polls were parked.", &m->wait_seconds);
    emit_histogram(&o, "pilotlight_event_loop_lag_seconds",
                   "How late the event loop ran work it had scheduled.", &m->loop_lag);
    emit(&o, "# HELP pilotlight_connections_refused_total Connections refused, by reason.\n"
             "# TYPE pilotlight_connections_refused_total counter\n"
             "pilotlight_connections_refused_total{reason=\"max_connections\"} %llu\n"
             "pilotlight_connections_refused_total{reason=\"fd_limit\"} %llu\n",
         (unsigned long long)m->refused[0], (unsigned long long)m->refused[1]);
    emit(&o, "# HELP pilotlight_build_info The running version.\n"
             "# TYPE pilotlight_build_info gauge\n"
             "pilotlight_build_info{version=\"%s\"} 1\n", PL_VERSION);
    emit(&o, "# HELP pilotlight_adopted_total Parked polls taken over from an older process "
             "(binary upgrade); the ledger is parked_now + settled == parked_total + adopted.\n"
             "# TYPE pilotlight_adopted_total counter\npilotlight_adopted_total %llu\n",
         (unsigned long long)l->adopted);
    emit(&o, "# HELP pilotlight_token_secret_valid_total Valid deployment tokens, by the "
             "secret that signed them.\n# TYPE pilotlight_token_secret_valid_total counter\n"
             "pilotlight_token_secret_valid_total{secret=\"current\"} %llu\n"
             "pilotlight_token_secret_valid_total{secret=\"previous\"} %llu\n",
         (unsigned long long)m->token_secret[0], (unsigned long long)m->token_secret[1]);
    emit(&o, "# HELP pilotlight_expiring_passed_total Parked polls passed over for a run "
             "because their controller was about to give up on them.\n"
             "# TYPE pilotlight_expiring_passed_total counter\n"
             "pilotlight_expiring_passed_total %llu\n", (unsigned long long)m->passed_expiring);
    emit(&o, "# HELP pilotlight_forbidden_total Requests refused 403 because dispatch_allow "
             "leaves their address out.\n# TYPE pilotlight_forbidden_total counter\n"
             "pilotlight_forbidden_total %llu\n", (unsigned long long)m->forbidden);
    emit(&o, "# HELP pilotlight_config_reloads_total Configuration reloads (SIGHUP), by result.\n"
             "# TYPE pilotlight_config_reloads_total counter\n"
             "pilotlight_config_reloads_total{result=\"ok\"} %llu\n"
             "pilotlight_config_reloads_total{result=\"error\"} %llu\n",
         (unsigned long long)m->reloads[0], (unsigned long long)m->reloads[1]);
    emit(&o, "# HELP pilotlight_upgrades_total Binary upgrades (SIGUSR2) this process began, "
             "by result.\n# TYPE pilotlight_upgrades_total counter\n");
    for (int i = 0; i < PL_UPGRADE__COUNT; i++)
        emit(&o, "pilotlight_upgrades_total{result=\"%s\"} %llu\n", upgrade_names[i],
             (unsigned long long)m->upgrades[i]);
    emit(&o, "# HELP pilotlight_config_max_waiters max_waiters in effect.\n"
             "# TYPE pilotlight_config_max_waiters gauge\npilotlight_config_max_waiters %llu\n"
             "# HELP pilotlight_config_max_waiters_per_key max_waiters_per_key in effect.\n"
             "# TYPE pilotlight_config_max_waiters_per_key gauge\n"
             "pilotlight_config_max_waiters_per_key %llu\n"
             "# HELP pilotlight_config_max_connections max_connections in effect.\n"
             "# TYPE pilotlight_config_max_connections gauge\n"
             "pilotlight_config_max_connections %llu\n",
         (unsigned long long)m->max_waiters, (unsigned long long)m->max_waiters_per_key,
         (unsigned long long)m->max_connections);
    emit(&o, "# HELP pilotlight_confirm_method_total Deliveries confirmed (delivery = confirm), "
             "by how the acknowledgement was learnt.\n"
             "# TYPE pilotlight_confirm_method_total counter\n");
    for (int i = 0; i < PL_CONFIRM_BY__COUNT; i++)
        emit(&o, "pilotlight_confirm_method_total{method=\"%s\"} %llu\n",
             confirm_method_names[i], (unsigned long long)m->confirm.method[i]);
    emit(&o, "# HELP pilotlight_confirm_total Delivery attempts to a controller "
             "(delivery = confirm), by outcome; redelivered: offered to the next poll "
             "(docs/delivery.md).\n"
             "# TYPE pilotlight_confirm_total counter\n");
    for (int i = 0; i < PL_CONFIRM__COUNT; i++)
        emit(&o, "pilotlight_confirm_total{outcome=\"%s\"} %llu\n", confirm_names[i],
             (unsigned long long)m->confirm.outcome[i]);
    emit(&o, "# HELP pilotlight_confirm_ack_events_refused_total Controller connections "
             "whose kernel refused ACK reports (confirmed by polling instead).\n"
             "# TYPE pilotlight_confirm_ack_events_refused_total counter\n"
             "pilotlight_confirm_ack_events_refused_total %llu\n",
         (unsigned long long)m->confirm.ack_events_refused);
    emit(&o, "# HELP pilotlight_confirm_probes_total Parked polls sent a keepalive probe "
             "because a delivery to their key was late.\n"
             "# TYPE pilotlight_confirm_probes_total counter\n"
             "pilotlight_confirm_probes_total %llu\n"
             "# HELP pilotlight_confirm_skipped_total Parked polls passed over for a run "
             "because their probe went unanswered.\n"
             "# TYPE pilotlight_confirm_skipped_total counter\n"
             "pilotlight_confirm_skipped_total %llu\n",
         (unsigned long long)m->confirm.probes, (unsigned long long)m->confirm.skipped);
    emit_histogram(&o, "pilotlight_confirm_ack_seconds",
                   "Time from writing a payload to its ACK report.", &m->confirm.ack_seconds);
    if (m->ring_on)
        emit_ring(&o, m);
    emit_pools(&o);
    if (m->proc_ok)
        emit_process(&o, &m->proc);
    return o.overflow ? 0 : o.len;
}
