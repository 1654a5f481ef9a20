/* conn_timers.c -- the timer lists of a server's connections: one timeout
 * per list, so appending keeps a list sorted by deadline and expiry looks
 * only at its head; one libuv timer serves them all. */
#include <utlist.h>

#include "transport.h"

static void resume_cb(uv_idle_t *idle);
static void timer_arm(pl_http *h, uint64_t due);

void pl__list_remove(pl_conn *c)
{
    if (c->list == TL_NONE)
        return;
    DL_DELETE2(pl__conn_http(c)->lists[c->list], c, lprev, lnext);
    c->list = TL_NONE;
}

void pl__list_add(pl_conn *c, uint8_t which)
{
    pl_http *h = pl__conn_http(c);
    uint64_t now = uv_now(h->loop);

    pl__list_remove(c);
    c->list = which;
    c->since = (uint32_t)now;
    DL_APPEND2(h->lists[which], c, lprev, lnext);
    if (which == TL_RESUME)
        uv_idle_start(&h->resume, resume_cb);
    else
        timer_arm(h, now + h->timeouts[which]);
}

/* When list <i>'s head (there is one) is due, seen at <now>. */
static uint64_t list_due(const pl_http *h, int i, uint64_t now)
{
    uint64_t waited = (uint32_t)now - h->lists[i]->since;

    return waited < h->timeouts[i] ? now + h->timeouts[i] - waited : now;
}

static void timer_cb(uv_timer_t *t)
{
    pl_http *h = container_of(t, pl_http, timer);
    uint64_t now = uv_now(h->loop), next = UINT64_MAX;

    h->timer_due = 0;
    for (int i = TL_REQUEST; i <= TL_LINGER; i++) {
        pl_conn **head = &h->lists[i];
        while (*head && (uint32_t)now - (*head)->since >= h->timeouts[i])
            h->expire(*head); /* always leaves the list */
        if (*head && list_due(h, i, now) < next)
            next = list_due(h, i, now);
    }
    if (next != UINT64_MAX)
        timer_arm(h, next);
}

static void timer_arm(pl_http *h, uint64_t due)
{
    if (h->timer_due != 0 && h->timer_due <= due)
        return;
    h->timer_due = due;
    pl_timer_at(&h->timer, timer_cb, due, 0);
}

/* A connection whose answer arrived while pipelined bytes waited behind
 * it is read again here, on the loop's next turn, never from inside
 * another connection's callback. */
static void resume_cb(uv_idle_t *idle)
{
    pl_http *h = container_of(idle, pl_http, resume);

    while (h->lists[TL_RESUME]) {
        pl_conn *c = h->lists[TL_RESUME];
        pl__list_add(c, TL_IDLE); /* until its next request begins */
        h->resume_one(c);
    }
    uv_idle_stop(idle);
}

void pl__timers_rearm(pl_http *h)
{
    /* Every member of a list gets the list's new timeout: the lists stay
     * sorted, only the timer may now be due earlier. */
    for (int i = TL_REQUEST; i <= TL_LINGER; i++)
        if (h->lists[i] != NULL)
            timer_arm(h, list_due(h, i, uv_now(h->loop)));
}
