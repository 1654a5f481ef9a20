/* lag.c -- samples event-loop lag from a periodic kernel timer. */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <sys/timerfd.h>

#include "pilotlight/lag.h"
#include "pilotlight/log.h"
#include "pilotlight/mem.h"

struct pl_lag {
    uv_poll_t poll;
    int fd;
    uint64_t period_ns;
    uint64_t next_ns; /* the first expiry not yet observed */
    pl_histogram *h;
};

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void on_expired(uv_poll_t *p, int status, int events)
{
    pl_lag *l = (pl_lag *)p;
    uint64_t n, now;

    (void)events;
    if (status < 0 || read(l->fd, &n, sizeof(n)) != (ssize_t)sizeof(n))
        return; /* EAGAIN: woken for nothing */
    now = now_ns();
    for (uint64_t i = 0; i < n; i++, l->next_ns += l->period_ns)
        pl_histogram_observe(l->h, now > l->next_ns ? (double)(now - l->next_ns) / 1e9 : 0);
}

pl_lag *pl_lag_start(uv_loop_t *loop, pl_histogram *h, unsigned period_ms)
{
    pl_lag *l = pl_malloc(sizeof(*l));
    struct itimerspec its;

    if (l == NULL)
        return NULL;
    memset(l, 0, sizeof(*l));
    l->h = h;
    l->period_ns = (uint64_t)period_ms * 1000000u;
    l->next_ns = now_ns() + l->period_ns;
    /* Absolute expiries on the same clock as now_ns(): no drift from the
     * time the loop takes to re-arm, and nothing rounded to milliseconds. */
    its.it_interval.tv_sec = (time_t)(l->period_ns / 1000000000u);
    its.it_interval.tv_nsec = (long)(l->period_ns % 1000000000u);
    its.it_value.tv_sec = (time_t)(l->next_ns / 1000000000u);
    its.it_value.tv_nsec = (long)(l->next_ns % 1000000000u);
    l->fd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (l->fd < 0 || timerfd_settime(l->fd, TFD_TIMER_ABSTIME, &its, NULL) != 0 ||
        uv_poll_init(loop, &l->poll, l->fd) != 0) {
        PL_LOG(PL_LOG_WARN, "event-loop lag not measured", "\"error\":\"%s\"", strerror(errno));
        if (l->fd >= 0)
            close(l->fd);
        pl_free(l);
        return NULL;
    }
    uv_poll_start(&l->poll, UV_READABLE, on_expired);
    return l;
}

void pl_lag_stop(pl_lag *l)
{
    if (l == NULL || l->fd < 0)
        return;
    if (!uv_is_closing((uv_handle_t *)&l->poll))
        uv_close((uv_handle_t *)&l->poll, NULL);
    close(l->fd); /* safe at once: uv_close stopped polling it */
    l->fd = -1;
}

void pl_lag_free(pl_lag *l)
{
    pl_lag_stop(l); /* a failed start closed its handle, not its timer */
    pl_free(l);
}
