/* test_metrics.c -- the Prometheus text exposition (metrics.h), read back
 * by a small parser of the 0.0.4 text format: every family announced with
 * HELP and TYPE before its samples, each sample where its label says,
 * histograms cumulative up to +Inf, the ledger as the engine keeps it. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "pilotlight/metrics.h"
#include "pilotlight/pool.h"
#include "unit.h"

#define MAX_SAMPLES 512
#define MAX_FAMILIES 96

typedef struct {
    char name[80];
    char labels[160]; /* as written between the braces, "" when none */
    double value;
} sample;

typedef struct {
    char name[80];
    char type[16];
    int helped;
    int samples;
} family;

/* What parse() finds wrong is printed, except where a test wants it to. */
static int quiet;
#define complain(...) (quiet ? (void)0 : (void)fprintf(stderr, __VA_ARGS__))

static sample samples[MAX_SAMPLES];
static family families[MAX_FAMILIES];
static int nsamples, nfamilies;
static char text[64 * 1024];

static family *family_named(const char *name, size_t len)
{
    for (int i = 0; i < nfamilies; i++)
        if (strlen(families[i].name) == len && strncmp(families[i].name, name, len) == 0)
            return &families[i];
    return NULL;
}

/* The family a sample named <name> belongs to: itself, or a histogram's. */
static family *family_of(const char *name)
{
    static const char *const suffixes[] = {"_bucket", "_sum", "_count"};
    size_t len = strlen(name);
    family *f = family_named(name, len);

    if (f != NULL)
        return f;
    for (size_t i = 0; i < 3; i++) {
        size_t sl = strlen(suffixes[i]);
        if (len > sl && strcmp(name + len - sl, suffixes[i]) == 0 &&
            (f = family_named(name, len - sl)) != NULL && strcmp(f->type, "histogram") == 0)
            return f;
    }
    return NULL;
}

static int name_char(char c, int first)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':' ||
           (!first && c >= '0' && c <= '9');
}

/* Reads a metric or label name at *p; returns its length (0: none). */
static size_t read_name(const char **p)
{
    const char *start = *p, *s = start;

    if (!name_char(*s, 1))
        return 0;
    while (name_char(*s, 0))
        s++;
    *p = s;
    return (size_t)(s - start);
}

/* Parses one sample line; returns 0, or -1 when it is not one. */
static int parse_sample(const char *line, const char *end, sample *out)
{
    const char *p = line, *start = line;
    char *num_end;
    char num[64];

    if (!name_char(*p, 1))
        return -1;
    while (p < end && name_char(*p, 0))
        p++;
    if ((size_t)(p - start) >= sizeof(out->name))
        return -1;
    memcpy(out->name, start, (size_t)(p - start));
    out->name[p - start] = '\0';
    out->labels[0] = '\0';
    if (p < end && *p == '{') {
        const char *lstart = ++p;
        /* name="value" pairs, comma-separated; values escape \ " and newline */
        while (p < end && *p != '}') {
            const char *n = p;
            if (read_name(&p) == 0 || p == n || p >= end || *p++ != '=' || p >= end ||
                *p++ != '"')
                return -1;
            while (p < end && *p != '"') {
                if (*p == '\\') {
                    if (p + 1 >= end || strchr("\\\"n", p[1]) == NULL)
                        return -1;
                    p++;
                }
                p++;
            }
            if (p >= end)
                return -1;
            p++; /* closing quote */
            if (p < end && *p == ',')
                p++;
            else if (p < end && *p != '}')
                return -1;
        }
        if (p >= end || (size_t)(p - lstart) >= sizeof(out->labels))
            return -1;
        memcpy(out->labels, lstart, (size_t)(p - lstart));
        out->labels[p - lstart] = '\0';
        p++;
    }
    if (p >= end || *p++ != ' ' || (size_t)(end - p) >= sizeof(num) || end == p)
        return -1;
    memcpy(num, p, (size_t)(end - p));
    num[end - p] = '\0';
    if (strcmp(num, "+Inf") == 0) {
        out->value = INFINITY;
        return 0;
    }
    out->value = strtod(num, &num_end);
    return *num_end == '\0' && num_end != num ? 0 : -1;
}

/* Reads <len> bytes of exposition into samples[] and families[]; returns
 * the number of lines that break the format (each printed). */
static int parse(const char *t, size_t len)
{
    const char *p = t, *end = t + len;
    family *current = NULL;
    int bad = 0, lineno = 0;

    nsamples = nfamilies = 0;
    if (len == 0 || t[len - 1] != '\n') {
        complain("exposition does not end in a newline\n");
        bad++;
    }
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *eol = nl ? nl : end;
        char word[16];
        const char *name;
        size_t nlen;

        lineno++;
        if (eol - p > 7 && (strncmp(p, "# HELP ", 7) == 0 || strncmp(p, "# TYPE ", 7) == 0)) {
            int help = p[2] == 'H';
            family *f;
            name = p + 7;
            const char *q = name;
            nlen = read_name(&q);
            if (nlen == 0 || q >= eol || *q != ' ' || q + 1 >= eol) {
                complain("line %d: malformed comment\n", lineno);
                bad++;
            } else if ((f = family_named(name, nlen)) == NULL) {
                if (!help || nfamilies == MAX_FAMILIES) {
                    complain("line %d: TYPE before HELP\n", lineno);
                    bad++;
                } else {
                    f = &families[nfamilies++];
                    memset(f, 0, sizeof(*f));
                    memcpy(f->name, name, nlen < 79 ? nlen : 79);
                    f->helped = 1;
                    current = f;
                }
            } else if (help || f->type[0] || f != current) {
                complain("line %d: %.*s announced twice\n", lineno, (int)nlen, name);
                bad++;
            } else {
                size_t tl = (size_t)(eol - q - 1);
                memcpy(word, q + 1, tl < 15 ? tl : 15);
                word[tl < 15 ? tl : 15] = '\0';
                if (strcmp(word, "counter") && strcmp(word, "gauge") &&
                    strcmp(word, "histogram")) {
                    complain("line %d: type %s\n", lineno, word);
                    bad++;
                }
                strcpy(f->type, word);
            }
        } else if (nsamples < MAX_SAMPLES &&
                   parse_sample(p, eol, &samples[nsamples]) == 0) {
            family *f = family_of(samples[nsamples].name);
            if (f == NULL || f != current || !f->type[0]) {
                complain("line %d: %s outside its family's block\n", lineno,
                        samples[nsamples].name);
                bad++;
            } else {
                f->samples++;
            }
            nsamples++;
        } else {
            complain("line %d: not a sample: %.*s\n", lineno, (int)(eol - p), p);
            bad++;
        }
        p = eol + 1;
    }
    for (int i = 0; i < nfamilies; i++) {
        if (!families[i].type[0]) {
            complain("%s: no TYPE\n", families[i].name);
            bad++;
        }
    }
    return bad;
}

/* The value of the sample <name>{<labels>}; NAN when there is none. */
static double value(const char *name, const char *labels)
{
    for (int i = 0; i < nsamples; i++)
        if (strcmp(samples[i].name, name) == 0 && strcmp(samples[i].labels, labels) == 0)
            return samples[i].value;
    fprintf(stderr, "no sample %s{%s}\n", name, labels);
    return NAN;
}

static const char *type_of(const char *name)
{
    family *f = family_named(name, strlen(name));
    return f ? f->type : "";
}

/* Checks the histogram <name>: le ascending, counts cumulative, +Inf last
 * and equal to _count. Returns how many buckets it has. */
static int check_histogram(const char *name)
{
    char bucket[96], sum[96], count[96];
    double last_le = -INFINITY, last = 0;
    int n = 0, inf = 0;

    snprintf(bucket, sizeof(bucket), "%s_bucket", name);
    snprintf(sum, sizeof(sum), "%s_sum", name);
    snprintf(count, sizeof(count), "%s_count", name);
    CHECK_STR(type_of(name), "histogram");
    for (int i = 0; i < nsamples; i++) {
        double le;
        if (strcmp(samples[i].name, bucket) != 0)
            continue;
        CHECK(!inf); /* nothing after +Inf */
        CHECK(strncmp(samples[i].labels, "le=\"", 4) == 0);
        le = strcmp(samples[i].labels, "le=\"+Inf\"") == 0 ? INFINITY
                                                          : strtod(samples[i].labels + 4, NULL);
        inf = isinf(le);
        CHECK(le > last_le);
        CHECK(samples[i].value >= last);
        last_le = le;
        last = samples[i].value;
        n++;
    }
    CHECK(inf);
    CHECK(last == value(count, ""));
    CHECK(!isnan(value(sum, "")));
    return n;
}

static pl_metrics m;
static pl_ledger ledger;

static size_t render(void)
{
    size_t n = pl_metrics_render(&m, &ledger, 3, text, sizeof(text));
    CHECK(n > 0 && n < sizeof(text));
    CHECK_EQ(parse(text, n), 0);
    return n;
}

static void test_every_family_announced(void)
{
    static const char *const histograms[] = {
        "pilotlight_dispatch_duration_seconds", "pilotlight_wait_duration_seconds",
        "pilotlight_event_loop_lag_seconds", "pilotlight_confirm_ack_seconds"};

    pl_metrics_init(&m);
    memset(&ledger, 0, sizeof(ledger));
    render(); /* parse() fails a family without HELP, TYPE or samples */
    CHECK(nfamilies >= 25);
    for (size_t i = 0; i < 4; i++)
        CHECK(check_histogram(histograms[i]) >= 2);
    CHECK_STR(type_of("pilotlight_parked_now"), "gauge");
    CHECK_STR(type_of("pilotlight_parked_total"), "counter");
    CHECK_STR(type_of("pilotlight_settled_total"), "counter");
    CHECK_STR(type_of("pilotlight_connections_open"), "gauge");
    for (int i = 0; i < nfamilies; i++) {
        size_t len = strlen(families[i].name);
        /* counters end in _total, as Prometheus's conventions ask */
        if (strcmp(families[i].type, "counter") == 0)
            CHECK(len > 6 && strcmp(families[i].name + len - 6, "_total") == 0);
        /* a sample each, zero or not (a rate() needs a start), but for the
         * pools' families: one sample a pool, and none is in use yet */
        if (strncmp(families[i].name, "pilotlight_pool_", 16) != 0)
            CHECK(families[i].samples > 0);
    }
    CHECK(value("pilotlight_build_info", "version=\"" PL_VERSION "\"") == 1);
    /* no process figures when /proc could not be read */
    CHECK(family_named("process_cpu_seconds_total", 25) == NULL);
}

static void test_histogram_buckets(void)
{
    const char *h = "pilotlight_dispatch_duration_seconds";

    pl_metrics_init(&m);
    pl_histogram_observe(&m.dispatch_seconds, 0.00001); /* on a bound: in it */
    pl_histogram_observe(&m.dispatch_seconds, 0.003);
    pl_histogram_observe(&m.dispatch_seconds, 0.004);
    pl_histogram_observe(&m.dispatch_seconds, 5);       /* past the last bound */
    pl_histogram_observe(&m.wait_seconds, 42);
    render();
    CHECK_EQ(check_histogram(h), 14); /* 13 bounds and +Inf */
    CHECK(value("pilotlight_dispatch_duration_seconds_bucket", "le=\"1e-05\"") == 1);
    CHECK(value("pilotlight_dispatch_duration_seconds_bucket", "le=\"0.0025\"") == 1);
    CHECK(value("pilotlight_dispatch_duration_seconds_bucket", "le=\"0.005\"") == 3);
    CHECK(value("pilotlight_dispatch_duration_seconds_bucket", "le=\"1\"") == 3);
    CHECK(value("pilotlight_dispatch_duration_seconds_bucket", "le=\"+Inf\"") == 4);
    CHECK(value("pilotlight_dispatch_duration_seconds_count", "") == 4);
    CHECK(fabs(value("pilotlight_dispatch_duration_seconds_sum", "") - 5.00701) < 1e-9);
    CHECK(value("pilotlight_wait_duration_seconds_bucket", "le=\"30\"") == 0);
    CHECK(value("pilotlight_wait_duration_seconds_bucket", "le=\"60\"") == 1);
    CHECK(value("pilotlight_wait_duration_seconds_count", "") == 1);
    CHECK(value("pilotlight_event_loop_lag_seconds_count", "") == 0);
}

static void test_ledger_identity(void)
{
    double settled = 0;
    uint64_t total = 0;

    pl_metrics_init(&m);
    memset(&ledger, 0, sizeof(ledger));
    /* every outcome a different figure, so a swapped label shows */
    ledger.parked_total = 1000;
    ledger.adopted = 7;
    for (int i = 0; i < PL_OUTCOME__COUNT; i++) {
        ledger.settled[i] = (uint64_t)(10 * (i + 1));
        total += ledger.settled[i];
    }
    ledger.parked_now = ledger.parked_total + ledger.adopted - total;
    render();
    CHECK(value("pilotlight_parked_now", "") == (double)ledger.parked_now);
    CHECK(value("pilotlight_parked_total", "") == 1000);
    CHECK(value("pilotlight_adopted_total", "") == 7);
    CHECK(value("pilotlight_keys_now", "") == 3);
    for (int i = 0; i < PL_OUTCOME__COUNT; i++) {
        char labels[64];
        snprintf(labels, sizeof(labels), "outcome=\"%s\"", pl_outcome_name((pl_outcome)i));
        CHECK(value("pilotlight_settled_total", labels) == 10 * (i + 1));
        settled += value("pilotlight_settled_total", labels);
    }
    CHECK(value("pilotlight_settled_total", "outcome=\"matched\"") == 10);
    CHECK(value("pilotlight_settled_total", "outcome=\"aborted\"") == 90);
    /* what an operator's alert computes, from the text alone */
    CHECK(value("pilotlight_parked_now", "") + settled ==
          value("pilotlight_parked_total", "") + value("pilotlight_adopted_total", ""));
}

static void test_labels(void)
{
    static const char *const results[] = {"hit", "miss", "invalid", "abandoned",
                                          "unconfirmed", "off"};
    static const char *const methods[] = {"ack_event", "poll_fallback", "next_request",
                                          "next_turn", "late_check"};
    static const char *const confirms[] = {"acked", "unsent", "closed_unread",
                                           "unacknowledged", "reset_after_send",
                                           "redelivered"};
    static const char *const upgrades[] = {"handed_over", "failed", "timeout", "aborted"};
    static const char *const tokens[] = {"valid", "invalid", "legacy", "absent"};
    char labels[96];

    pl_metrics_init(&m);
    memset(&ledger, 0, sizeof(ledger));
    for (int i = 0; i < PL_DISPATCH__COUNT; i++)
        m.dispatch[i] = (uint64_t)(100 + i);
    for (int i = 0; i < PL_CONFIRM_BY__COUNT; i++)
        m.confirm.method[i] = (uint64_t)(200 + i);
    for (int i = 0; i < PL_CONFIRM__COUNT; i++)
        m.confirm.outcome[i] = (uint64_t)(300 + i);
    for (int i = 0; i < PL_UPGRADE__COUNT; i++)
        m.upgrades[i] = (uint64_t)(400 + i);
    for (int i = 0; i < 4; i++)
        m.token[i] = (uint64_t)(500 + i);
    m.refused[0] = 11;
    m.refused[1] = 12;
    m.reloads[0] = 13;
    m.reloads[1] = 14;
    m.token_secret[0] = 15;
    m.token_secret[1] = 16;
    m.max_waiters = 17;
    m.max_waiters_per_key = 18;
    m.max_connections = 19;
    m.connections_open = 20;
    m.confirm.ack_events_refused = 21;
    m.confirm.probes = 22;
    m.confirm.skipped = 23;
    pl_metrics_count_http(&m, PL_ROUTE_PARK, 204);
    pl_metrics_count_http(&m, PL_ROUTE_PARK, 200);
    pl_metrics_count_http(&m, PL_ROUTE_DISPATCH, 400);
    pl_metrics_count_http(&m, PL_ROUTE_METRICS, 503);
    pl_metrics_count_http(&m, PL_ROUTE_OTHER, 101);
    pl_metrics_count_http(&m, PL_ROUTE_OTHER, 99);  /* not a status: nowhere */
    pl_metrics_count_http(&m, PL_ROUTE_OTHER, 600);
    render();

    for (int i = 0; i < PL_DISPATCH__COUNT; i++) {
        snprintf(labels, sizeof(labels), "result=\"%s\"", results[i]);
        CHECK(value("pilotlight_dispatch_total", labels) == 100 + i);
    }
    for (int i = 0; i < PL_CONFIRM_BY__COUNT; i++) {
        snprintf(labels, sizeof(labels), "method=\"%s\"", methods[i]);
        CHECK(value("pilotlight_confirm_method_total", labels) == 200 + i);
    }
    for (int i = 0; i < PL_CONFIRM__COUNT; i++) {
        snprintf(labels, sizeof(labels), "outcome=\"%s\"", confirms[i]);
        CHECK(value("pilotlight_confirm_total", labels) == 300 + i);
    }
    for (int i = 0; i < PL_UPGRADE__COUNT; i++) {
        snprintf(labels, sizeof(labels), "result=\"%s\"", upgrades[i]);
        CHECK(value("pilotlight_upgrades_total", labels) == 400 + i);
    }
    for (int i = 0; i < 4; i++) {
        snprintf(labels, sizeof(labels), "result=\"%s\"", tokens[i]);
        CHECK(value("pilotlight_token_checks_total", labels) == 500 + i);
    }
    CHECK(value("pilotlight_connections_refused_total", "reason=\"max_connections\"") == 11);
    CHECK(value("pilotlight_connections_refused_total", "reason=\"fd_limit\"") == 12);
    CHECK(value("pilotlight_config_reloads_total", "result=\"ok\"") == 13);
    CHECK(value("pilotlight_config_reloads_total", "result=\"error\"") == 14);
    CHECK(value("pilotlight_token_secret_valid_total", "secret=\"current\"") == 15);
    CHECK(value("pilotlight_token_secret_valid_total", "secret=\"previous\"") == 16);
    CHECK(value("pilotlight_config_max_waiters", "") == 17);
    CHECK(value("pilotlight_config_max_waiters_per_key", "") == 18);
    CHECK(value("pilotlight_config_max_connections", "") == 19);
    CHECK(value("pilotlight_connections_open", "") == 20);
    CHECK(value("pilotlight_confirm_ack_events_refused_total", "") == 21);
    CHECK(value("pilotlight_confirm_probes_total", "") == 22);
    CHECK(value("pilotlight_confirm_skipped_total", "") == 23);

    /* every route and class is there, zero or not: a rate() needs a start */
    {
        double total = 0;
        int n = 0;
        for (int i = 0; i < nsamples; i++) {
            if (strcmp(samples[i].name, "pilotlight_http_requests_total") == 0) {
                total += samples[i].value;
                n++;
            }
        }
        CHECK_EQ(n, PL_ROUTE__COUNT * 5);
        CHECK(total == 5);
    }
    CHECK(value("pilotlight_http_requests_total", "route=\"park\",class=\"2xx\"") == 2);
    CHECK(value("pilotlight_http_requests_total", "route=\"dispatch\",class=\"4xx\"") == 1);
    CHECK(value("pilotlight_http_requests_total", "route=\"metrics\",class=\"5xx\"") == 1);
    CHECK(value("pilotlight_http_requests_total", "route=\"other\",class=\"1xx\"") == 1);
    CHECK(value("pilotlight_http_requests_total", "route=\"debug\",class=\"2xx\"") == 0);
}

static pl_pool things = PL_POOL_INIT("test_thing", 100);

static void test_pools_and_process(void)
{
    void *a = pl_pool_get(&things), *b = pl_pool_get(&things);

    pl_metrics_init(&m);
    m.proc_ok = 1;
    m.proc.cpu_seconds = 1.5;
    m.proc.resident_bytes = 4096;
    m.proc.virtual_bytes = 8192;
    m.proc.open_fds = 9;
    m.proc.max_fds = 0; /* unlimited: no family at all */
    m.proc.start_time_seconds = 1750000000.25;
    render();
    CHECK(value("pilotlight_pool_objects_in_use", "pool=\"test_thing\"") == 2);
    CHECK(value("pilotlight_pool_reserved_bytes", "pool=\"test_thing\"") ==
          (double)pl_pool_reserved_bytes(&things));
    CHECK(value("pilotlight_pool_chunks_allocated_total", "pool=\"test_thing\"") == 1);
    CHECK(value("pilotlight_pool_chunks_returned_total", "pool=\"test_thing\"") == 0);
    CHECK(value("process_cpu_seconds_total", "") == 1.5);
    CHECK(value("process_resident_memory_bytes", "") == 4096);
    CHECK(value("process_virtual_memory_bytes", "") == 8192);
    CHECK(value("process_open_fds", "") == 9);
    CHECK(value("process_start_time_seconds", "") == 1750000000.25);
    CHECK(family_named("process_max_fds", 15) == NULL);
    m.proc.max_fds = 1024;
    render();
    CHECK(value("process_max_fds", "") == 1024);
    pl_pool_put(&things, a);
    pl_pool_put(&things, b);
}

static void test_too_small_a_buffer(void)
{
    size_t n;
    char *exact;

    pl_metrics_init(&m);
    memset(&ledger, 0, sizeof(ledger));
    n = pl_metrics_render(&m, &ledger, 0, text, sizeof(text));
    CHECK(n > 0);
    exact = malloc(n + 1);
    CHECK_EQ(pl_metrics_render(&m, &ledger, 0, exact, n + 1), n);
    CHECK(memcmp(exact, text, n) == 0);
    CHECK_EQ(pl_metrics_render(&m, &ledger, 0, exact, n), 0); /* no room for the NUL */
    CHECK_EQ(pl_metrics_render(&m, &ledger, 0, exact, 100), 0);
    free(exact);
}

/* The parser itself: a broken exposition must not pass it. */
static void test_the_parser_refuses(void)
{
    static const char *const bad[] = {
        "a 1\n",                                     /* no HELP, TYPE */
        "# HELP a x\na 1\n",                         /* no TYPE */
        "# TYPE a counter\n# HELP a x\na 1\n",        /* TYPE first */
        "# HELP a x\n# TYPE a counter\na{l=\"v} 1\n", /* unterminated label */
        "# HELP a x\n# TYPE a counter\na 1x\n",
        "# HELP a x\n# TYPE a counter\n# HELP b y\n# TYPE b gauge\nb 1\na 2\n",
        "# HELP a x\n# TYPE a summary\na 1\n",
        "# HELP a x\n# TYPE a counter\na 1",          /* no final newline */
    };

    quiet = 1;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        CHECK(parse(bad[i], strlen(bad[i])) > 0);
    quiet = 0;
    {
        const char *good = "# HELP a x\n# TYPE a counter\na{l=\"v\\\"\",k=\"w\"} 1\n";
        CHECK_EQ(parse(good, strlen(good)), 0);
        CHECK_STR(samples[0].labels, "l=\"v\\\"\",k=\"w\"");
    }
}

int main(void)
{
    RUN(test_the_parser_refuses);
    RUN(test_every_family_announced);
    RUN(test_histogram_buckets);
    RUN(test_ledger_identity);
    RUN(test_labels);
    RUN(test_pools_and_process);
    RUN(test_too_small_a_buffer);
    return unit_finish();
}
