/* lateness.c -- pl-lateness: how late this machine wakes a thread that asks
 * for a timer, for the lab's latency figures to say when the machine
 * itself was slow.
 *
 *   pl-lateness [PERIOD_US [THRESHOLD_US]]      (1000 and 1000 by default)
 *
 * One thread per CPU it may run on, each bound to its CPU, wakes every
 * PERIOD_US on an absolute CLOCK_MONOTONIC schedule, under SCHED_FIFO where
 * allowed (so what it sees is a CPU lost to the host or to interrupts, not
 * a queue of ordinary processes). A virtual machine's CPUs are stalled
 * mostly one at a time: a thread on one CPU seldom sees the other stop.
 * Each prints a line "CPU DUE_NS LATE_NS" for each wake-up THRESHOLD_US or
 * more past its due time. The times are CLOCK_MONOTONIC, Python's
 * time.monotonic() on Linux. A wake-up later than a period skips the ticks it missed: one
 * stall, one line. At SIGTERM, SIGINT or end of its parent it prints
 * "# wakeups N late M worst_ns W" over all CPUs and exits 0.
 *
 * Its own cost is one short wake-up a period per CPU; a line is written
 * only for a late one. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>

/* Set by the signal handler, read by every probe: lock-free, so both may
 * touch it. */
static atomic_int stop;
static int64_t period, threshold;
static pthread_mutex_t out_lock = PTHREAD_MUTEX_INITIALIZER;

typedef struct {
    pthread_t thread;
    int cpu;
    uint64_t wakeups, late;
    int64_t worst;
} probe;

static void on_signal(int sig)
{
    (void)sig;
    atomic_store(&stop, 1);
}

static int64_t ns_of(const struct timespec *t)
{
    return (int64_t)t->tv_sec * 1000000000 + t->tv_nsec;
}

static struct timespec ts_of(int64_t ns)
{
    struct timespec t = {(time_t)(ns / 1000000000), (long)(ns % 1000000000)};
    return t;
}

static int64_t arg_us(const char *s, int64_t dflt)
{
    char *end;
    long v;

    if (s == NULL)
        return dflt;
    v = strtol(s, &end, 10);
    if (*end != '\0' || v <= 0 || v > 10000000) {
        fprintf(stderr, "pl-lateness: not a count of microseconds: %s\n", s);
        exit(2);
    }
    return (int64_t)v;
}

static void *run(void *arg)
{
    probe *p = arg;
    struct sched_param sp = {.sched_priority = 1};
    struct timespec now;
    cpu_set_t one;
    int64_t due;

    CPU_ZERO(&one);
    CPU_SET(p->cpu, &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
    if (pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) != 0 && p->cpu == 0)
        fprintf(stderr, "pl-lateness: SCHED_FIFO refused, measuring as an ordinary process\n");
    clock_gettime(CLOCK_MONOTONIC, &now);
    due = ns_of(&now) + period;
    while (!atomic_load(&stop)) {
        struct timespec t = ts_of(due);
        int64_t lateness;

        if (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &t, NULL) == EINTR)
            continue;
        clock_gettime(CLOCK_MONOTONIC, &now);
        lateness = ns_of(&now) - due;
        p->wakeups++;
        if (lateness > p->worst)
            p->worst = lateness;
        if (lateness >= threshold) {
            p->late++;
            pthread_mutex_lock(&out_lock);
            printf("%d %" PRId64 " %" PRId64 "\n", p->cpu, due, lateness);
            pthread_mutex_unlock(&out_lock);
        }
        due += period;
        if (due <= ns_of(&now)) /* missed ticks: resume from now */
            due = ns_of(&now) + period;
    }
    return NULL;
}

int main(int argc, char **argv)
{
    struct sigaction sa = {.sa_handler = on_signal};
    uint64_t wakeups = 0, late = 0;
    int64_t worst = 0;
    probe probes[CPU_SETSIZE];
    int n = 0;
    cpu_set_t cpus;
    sigset_t all, waiting;

    period = arg_us(argc > 1 ? argv[1] : NULL, 1000) * 1000;
    threshold = arg_us(argc > 2 ? argv[2] : NULL, 1000) * 1000;
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGINT, &sa, NULL);
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    setvbuf(stdout, NULL, _IOLBF, 0);
    if (sched_getaffinity(0, sizeof(cpus), &cpus) != 0) {
        perror("pl-lateness: sched_getaffinity");
        return 1;
    }
    /* The probes take no signal: the main thread does, in sigsuspend()
     * alone (a signal between a look at the flag and a pause() would be
     * lost), and the probes see the flag within a period. */
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &waiting);
    sigdelset(&waiting, SIGTERM);
    sigdelset(&waiting, SIGINT);
    for (int cpu = 0; cpu < CPU_SETSIZE; cpu++) {
        if (!CPU_ISSET(cpu, &cpus))
            continue;
        probes[n] = (probe){.cpu = cpu};
        if (pthread_create(&probes[n].thread, NULL, run, &probes[n]) != 0) {
            perror("pl-lateness: pthread_create");
            return 1;
        }
        n++;
    }
    while (!atomic_load(&stop))
        sigsuspend(&waiting);
    for (int i = 0; i < n; i++) {
        pthread_join(probes[i].thread, NULL);
        wakeups += probes[i].wakeups;
        late += probes[i].late;
        if (probes[i].worst > worst)
            worst = probes[i].worst;
    }
    printf("# wakeups %" PRIu64 " late %" PRIu64 " worst_ns %" PRId64 "\n", wakeups, late, worst);
    return 0;
}
