/* status_page.c -- GET /status: the status page, rendered whole here (a
 * reader without JavaScript has it all), its script refreshing it from
 * /debug/status. Every string a client sent is escaped. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "status_html.h"
#include "status_view.h"

typedef struct {
    pl_buf b;
    int failed;
} html;

static void put(html *h, const char *s, size_t n)
{
    if (!h->failed && pl_buf_append(&h->b, s, n) != 0)
        h->failed = 1;
}

static void put_str(html *h, const char *s)
{
    put(h, s, strlen(s));
}

/* Numbers and fixed words: never a client's string (put_text). */
static void putf(html *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void putf(html *h, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    int n;

    va_start(ap, fmt);
    n = vsnprintf(buf, sizeof(buf), fmt, ap);
    va_end(ap);
    if (n > 0)
        put(h, buf, (size_t)n < sizeof(buf) ? (size_t)n : sizeof(buf) - 1);
}

/* A client's string as HTML text or attribute value: the five characters
 * that mean something there escaped, control characters shown as U+FFFD. */
static void put_text(html *h, const char *s, size_t n)
{
    size_t from = 0;

    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        const char *rep = ch == '&'  ? "&amp;"
                          : ch == '<' ? "&lt;"
                          : ch == '>' ? "&gt;"
                          : ch == '"' ? "&quot;"
                          : ch == '\'' ? "&#39;"
                          : ch < 0x20 || ch == 0x7f ? "\xef\xbf\xbd"
                                                    : NULL;
        if (rep == NULL)
            continue;
        put(h, s + from, i - from);
        put_str(h, rep);
        from = i + 1;
    }
    put(h, s + from, n - from);
}

static void put_time(html *h, uint64_t ms)
{
    time_t t = (time_t)(ms / 1000);
    struct tm tm;

    gmtime_r(&t, &tm);
    putf(h, "%02d:%02d:%02d", tm.tm_hour, tm.tm_min, tm.tm_sec);
}

/* A wait: seconds up to two minutes, then minutes (as the script shows it). */
static void put_age(html *h, uint64_t ms)
{
    uint64_t s = ms / 1000;

    if (s < 120)
        putf(h, "%llu s", (unsigned long long)s);
    else
        putf(h, "%llu min", (unsigned long long)(s / 60));
}

static void put_ratio(html *h, uint64_t hits, uint64_t misses)
{
    if (hits + misses == 0)
        put_str(h, "–");
    else
        putf(h, "%llu %%", (unsigned long long)(hits * 100 / (hits + misses)));
}

static void put_key_cells(html *h, const pl_key *k)
{
    put_str(h, "<td class=\"dep\">");
    put_text(h, k->deployment, k->deployment_len);
    put_str(h, "</td><td class=\"ver\">");
    put_text(h, k->version, k->version_len);
    putf(h, "</td><td class=\"cpu\">%g</td><td class=\"mem\">%g</td>", k->cpu, k->memory);
}

static void page_health(html *h, const pl_status_view *s)
{
    putf(h, "<p class=\"health %s\">", s->state);
    put_text(h, s->health, strlen(s->health));
    put_str(h, "</p>");
}

static void page_updated(html *h, const pl_status_view *s)
{
    put_str(h, "updated ");
    put_time(h, s->wall_ms);
    put_str(h, " UTC");
}

static void fact(html *h, const char *key, const char *label)
{
    putf(h, "<div><dt>%s</dt><dd data-k=\"%s\">", label, key);
}

static void page_summary(html *h, const pl_status_view *s)
{
    const pl_metrics *m = s->m;

    put_str(h, "<dl>");
    fact(h, "parked", "parked now");
    putf(h, "%llu</dd></div>",
         (unsigned long long)pl_engine_ledger(s->engine)->parked_now);
    fact(h, "keys", "keys parked");
    putf(h, "%zu</dd></div>", s->keys);
    fact(h, "hits", "hits, 10 min");
    putf(h, "%llu</dd></div>", (unsigned long long)s->all.total_hits);
    fact(h, "misses", "misses, 10 min");
    putf(h, "%llu</dd></div>", (unsigned long long)s->all.total_misses);
    fact(h, "ratio", "hit ratio, 10 min");
    put_ratio(h, s->all.total_hits, s->all.total_misses);
    put_str(h, "</dd></div>");
    fact(h, "answer", "answer p50 / p90 / p99");
    if (s->have_q)
        putf(h, "%llu / %llu / %llu µs", (unsigned long long)s->q_us[0],
             (unsigned long long)s->q_us[1], (unsigned long long)s->q_us[2]);
    else
        put_str(h, "–");
    put_str(h, "</dd></div></dl><p class=\"totals\">since start: ");
    for (int i = 0; i < PL_DISPATCH__COUNT; i++) {
        const char *r = pl__status_result_name((pl_dispatch_result)i);
        putf(h, "%s<span data-r=\"%s\">%s %llu</span>", i ? " · " : "", r, r,
             (unsigned long long)m->dispatch[i]);
    }
    put_str(h, "; misses by nearest: ");
    for (int i = 0; i < PL_NEAREST__COUNT; i++)
        putf(h, "%s<span data-n=\"%s\">%s %llu</span>", i ? " · " : "",
             pl_nearest_name((pl_nearest)i), pl_nearest_name((pl_nearest)i),
             (unsigned long long)m->miss_nearest[i]);
    put_str(h, "</p>");
}

static void page_pool(html *h, const pl_status_view *s)
{
    put_str(h, "<table><thead><tr><th>deployment</th><th>version</th><th>cpu</th><th>memory"
               "</th><th>parked</th><th>oldest</th><th>hits</th><th>misses</th><th>ratio</th>"
               "</tr></thead><tbody>");
    for (size_t i = 0; i < s->nrows; i++) {
        const pl_status_row *r = &s->rows[i];
        pl_key k = {s->text.data + r->dep, r->dep_len, s->text.data + r->ver, r->ver_len,
                    r->cpu, r->memory};

        put_str(h, "<tr>");
        put_key_cells(h, &k);
        putf(h, "<td class=\"parked\">%zu</td><td class=\"oldest\">", r->parked);
        if (r->parked > 0)
            put_age(h, r->oldest_wait_ms);
        else
            put_str(h, "–");
        putf(h, "</td><td class=\"hits\">%llu</td><td class=\"misses\">%llu</td>"
                "<td class=\"ratio\">",
             (unsigned long long)r->w.total_hits, (unsigned long long)r->w.total_misses);
        put_ratio(h, r->w.total_hits, r->w.total_misses);
        put_str(h, "</td></tr>");
    }
    if (s->nrows == 0)
        put_str(h, "<tr><td colspan=\"9\" class=\"none\">nothing parked, nothing dispatched "
                   "lately</td></tr>");
    put_str(h, "</tbody></table>");
    if (s->truncated)
        putf(h, "<p class=\"more\">the %d keys with the most parked of %zu</p>",
             PL_STATUS_PAGE_KEYS, s->keys);
}

typedef struct {
    html *h;
    const pl_status_view *s;
} page_out;

static void page_event(const pl_diag_event *ev, void *arg)
{
    page_out *o = arg;
    html *h = o->h;
    char why[PL_STATUS_WORDS_MAX];

    put_str(h, "<tr><td class=\"time\">");
    put_time(h, pl__status_wall(o->s, ev->at));
    put_str(h, "</td>");
    if (ev->result != PL_DISPATCH_HIT) {
        put_str(h, "<td class=\"run\">");
        put_text(h, ev->run, strlen(ev->run));
        if (ev->run_cut)
            put_str(h, "…");
        put_str(h, "</td>");
    }
    put_key_cells(h, &ev->key);
    putf(h, "<td class=\"answer\">%s (%s)</td><td class=\"took\">%llu µs</td>",
         ev->result == PL_DISPATCH_HIT ? "true" : "false", pl__status_result_name(ev->result),
         (unsigned long long)((ev->took_ns + 500) / 1000));
    if (ev->result == PL_DISPATCH_HIT) {
        put_str(h, "<td class=\"waited\">");
        put_age(h, ev->waited_ms);
        put_str(h, "</td>");
    } else {
        putf(h, "<td class=\"nearest\">%s</td><td class=\"why\">",
             ev->result == PL_DISPATCH_MISS ? pl_nearest_name(ev->nearest) : "–");
        pl_diag_why(ev, why, sizeof(why));
        put_text(h, why, strlen(why));
        put_str(h, "</td>");
    }
    put_str(h, "</tr>");
}

static void page_events(html *h, const pl_status_view *s, int misses)
{
    page_out o = {h, s};

    put_str(h, misses ? "<table><thead><tr><th>time</th><th>run</th>"
                      : "<table><thead><tr><th>time</th>");
    put_str(h, "<th>deployment</th><th>version</th><th>cpu</th><th>memory</th><th>answer</th>"
               "<th>took</th>");
    put_str(h, misses ? "<th>nearest</th><th>why</th>" : "<th>waited</th>");
    put_str(h, "</tr></thead><tbody>");
    if (pl_diag_each_event(s->diag, misses, page_event, &o) == 0)
        putf(h, "<tr><td colspan=\"%d\" class=\"none\">none yet</td></tr>", misses ? 10 : 8);
    put_str(h, "</tbody></table>");
}

static void page_peer(const pl_peer_info *p, void *arg)
{
    html *h = arg;

    put_str(h, "<tr><td class=\"name\">");
    put_text(h, p->name, strlen(p->name));
    putf(h, "</td><td class=\"state\">%s</td><td class=\"failed\">%u</td></tr>",
         p->self ? "self" : p->up ? "up" : "down", p->failed);
}

static void page_ring(html *h, const pl_status_view *s)
{
    if (s->peers == NULL) {
        put_str(h, "<p>no key ring: this instance serves every key</p>");
        return;
    }
    putf(h, "<p>%llu members in this instance's view</p><table><thead><tr><th>member</th>"
            "<th>state</th><th>failed checks</th></tr></thead><tbody>",
         (unsigned long long)s->m->ring_members);
    pl_peers_each(s->peers, page_peer, h);
    put_str(h, "</tbody></table>");
}

/* Renders the part of the page named <name> (<len> bytes). */
static void page_part(html *h, const pl_status_view *s, const char *name, size_t len)
{
    static const struct {
        const char *name;
        void (*fn)(html *h, const pl_status_view *s);
    } parts[] = {
        {"updated", page_updated}, {"health", page_health}, {"summary", page_summary},
        {"pool", page_pool},       {"ring", page_ring},
    };

    if (len == 7 && memcmp(name, "matches", 7) == 0)
        page_events(h, s, 0);
    else if (len == 6 && memcmp(name, "misses", 6) == 0)
        page_events(h, s, 1);
    for (size_t i = 0; i < sizeof(parts) / sizeof(parts[0]); i++)
        if (strlen(parts[i].name) == len && memcmp(parts[i].name, name, len) == 0)
            parts[i].fn(h, s);
}

/* The template with each <!--@name--> replaced by its part. */
static void page_render(html *h, const pl_status_view *s)
{
    const char *p = pl_status_html, *end = p + pl_status_html_len;

    while (p < end) {
        const char *mark = memmem(p, (size_t)(end - p), "<!--@", 5), *close;

        if (mark == NULL || (close = memmem(mark, (size_t)(end - mark), "-->", 3)) == NULL) {
            put(h, p, (size_t)(end - p));
            break;
        }
        put(h, p, (size_t)(mark - p));
        page_part(h, s, mark + 5, (size_t)(close - mark - 5));
        p = close + 3;
    }
}

void pl_status_page(pl_status *st, pl_conn *c, int draining)
{
    char headers[PL_CONN_EXTRA_MAX];
    html h = {{0}, 0};
    pl_status_view s;
    int n;

    if (pl__status_view(st, draining, &s) == 0)
        page_render(&h, &s);
    else
        h.failed = 1;
    pl__status_view_release(&s);
    n = snprintf(headers, sizeof(headers),
                 "Cache-Control: no-store\r\nContent-Security-Policy: %s\r\n"
                 "X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n",
                 pl_status_html_csp);
    if (n < 0 || (size_t)n >= sizeof(headers)) /* a template with more to name */
        pl_conn_respond_error(c, 500, "the page's headers do not fit");
    else if (h.failed)
        pl_conn_respond_error(c, 503, "out of memory");
    else
        pl_conn_respond(c, 200, "text/html; charset=utf-8", headers, h.b.data, h.b.len);
    pl_buf_free(&h.b);
}
