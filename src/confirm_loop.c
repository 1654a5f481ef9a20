/* confirm_loop.c -- the confirmations on the loop: their driver. */
#include <string.h>

#include "pilotlight/confirm_loop.h"
#include "pilotlight/loop.h"
#include "pilotlight/mem.h"

struct pl_confirm_loop {
    uv_loop_t *loop;
    pl_confirm *cf;
    uv_timer_t timer; /* pl_confirm_tick, at the due asked for */
    uv_check_t check; /* pl_confirm_turn, after each turn while asked */
};

static int acknowledged(pl_conn *c)
{
    return pl_conn_acknowledged(c);
}

static int tcp_info(pl_conn *c, pl_tcp_facts *t)
{
    return pl_conn_tcp_info(c, t);
}

static int ended(pl_conn *c)
{
    return pl_conn_ended(c);
}

static int peer_gone(pl_conn *c)
{
    return pl_conn_peer_gone(c);
}

static unsigned reports(pl_conn *c)
{
    return pl_conn_reports(c);
}

static uint64_t now_ms(void *drv)
{
    return uv_now(((pl_confirm_loop *)drv)->loop);
}

static uint64_t now_ns(void *drv)
{
    (void)drv;
    return uv_hrtime();
}

static void tick(uv_timer_t *t)
{
    pl_confirm_tick(container_of(t, pl_confirm_loop, timer)->cf);
}

static void arm(void *drv, uint64_t due)
{
    pl_confirm_loop *l = drv;

    if (due == UINT64_MAX)
        uv_timer_stop(&l->timer);
    else
        pl_timer_at(&l->timer, tick, due, 0);
}

static void turn(uv_check_t *check)
{
    pl_confirm_turn(container_of(check, pl_confirm_loop, check)->cf);
}

static void turns(void *drv, int on)
{
    pl_confirm_loop *l = drv;

    if (on)
        uv_check_start(&l->check, turn);
    else
        uv_check_stop(&l->check);
}

static const pl_confirm_io io = {
    .acknowledged = acknowledged,
    .tcp_info = tcp_info,
    .probe = pl_conn_probe,
    .ended = ended,
    .peer_gone = peer_gone,
    .hold = pl_conn_hold,
    .hold_on_eof = pl_conn_hold_on_eof,
    .release = pl_conn_release,
    .abort = pl_conn_abort,
    .set_owner = pl_conn_set_owner,
    .take_request = pl_conn_take_request,
    .set_reports = pl_conn_set_reports,
    .reports = reports,
    .now = now_ms,
    .now_ns = now_ns,
    .arm = arm,
    .turns = turns,
};

pl_confirm_loop *pl_confirm_loop_new(uv_loop_t *loop, pl_engine *engine,
                                     pl_confirm_counters *counters, const pl_confirm_opts *opts,
                                     pl_confirm_answer_fn answer, pl_confirm_poll_fn poll_ok,
                                     void *arg)
{
    pl_confirm_loop *l = pl_malloc(sizeof(*l));

    if (l == NULL)
        return NULL;
    memset(l, 0, sizeof(*l));
    l->loop = loop;
    l->cf = pl_confirm_new(&io, l, engine, counters, opts, answer, poll_ok, arg);
    if (l->cf == NULL) {
        pl_free(l);
        return NULL;
    }
    uv_timer_init(loop, &l->timer);
    uv_check_init(loop, &l->check);
    return l;
}

pl_confirm *pl_confirm_loop_confirm(pl_confirm_loop *l)
{
    return l->cf;
}

void pl_confirm_loop_stop(pl_confirm_loop *l)
{
    if (l == NULL)
        return;
    pl_confirm_stop(l->cf);
    uv_close((uv_handle_t *)&l->timer, NULL);
    uv_close((uv_handle_t *)&l->check, NULL);
}

void pl_confirm_loop_free(pl_confirm_loop *l)
{
    if (l == NULL)
        return;
    pl_confirm_free(l->cf);
    pl_free(l);
}
