/* wire.c -- pl-wire: a userspace packet wire between a TUN device in each of
 * two network namespaces, with one-way delay, jitter, loss, loss of pure
 * ACKs and blackholes, for the impaired-network tests (this kernel has no
 * netem qdisc).
 *
 *   pl-wire [--seed N] [--max-runtime-s S] [--queue N] [--mtu N] NS_A DEV_A NS_B DEV_B
 *
 * NS_* is a name under /var/run/netns (or a path holding a '/'); DEV_* is
 * the TUN device to create there. The wire prints "ready" once both exist;
 * the caller then gives them addresses, routes and their MTU, which must
 * not exceed --mtu (1500 by default; 68..65535): a longer packet is
 * counted as "other" and dropped. Direction "ab" carries what A's stack
 * sends to B, "ba" the reverse, "both" sets the two.
 *
 * Control: one command a line on stdin, each answered by one line on
 * stdout, "ok ..." or "error <why>":
 *   delay DIR US         one-way delay, microseconds
 *   jitter DIR US        extra delay per packet, uniform in [0, US]
 *   loss DIR P           probability (0..1) that any packet is dropped
 *   ackloss DIR P        probability that a pure ACK is dropped
 *   drop all on|off      drop every packet, both ways
 *   drop ip ADDR on|off  drop every packet from or to IPv4 ADDR
 *   seed N               restart the random sequence
 *   stats                counters, "ok ab_in=N ab_out=N ... queued=N": per
 *                        direction in, out, acks (pure ACKs that met the
 *                        ACK-loss draw), lost, acklost, dropped
 *                        (blackholes), full (queue overflow), other (not
 *                        IPv4, or longer than --mtu), werr (failed reads or
 *                        writes), bytes (IP bytes of the packets out),
 *                        segs (TCP segments out that carry data)
 *   count port N|off     also count, apart, the packets out with TCP port N
 *                        at either end (up to 4 ports; off forgets them):
 *                        "port<N>_ab_bytes=" and "_segs=" as above, and
 *                        "_acks=" (pure ACKs out), per direction, in stats
 *   reset                zero the counters
 *   quit                 exit (so does end of input)
 *
 * Bounded: exits when its parent dies, after --max-runtime-s (default 600)
 * and at end of input. Only IPv4 is carried; anything else is counted as
 * "other" and dropped. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

/* The largest packet --mtu may allow (IPv4's total length field). */
#define MTU_MAX 65535
#define MAX_DROP_IPS 16
#define MAX_PORTS 4

enum { TCP_FIN = 0x01, TCP_SYN = 0x02, TCP_RST = 0x04, TCP_ACK = 0x10 };

/* A queued packet; its bytes are in the direction's slot of the same index. */
struct pkt {
    uint64_t release_ns;
    size_t len;
};

struct counters {
    uint64_t in, out, acks, lost, acklost, dropped, full, other, werr, bytes, segs;
};

/* What left one way with a counted port at either end. */
struct port_counters {
    uint64_t bytes, segs, acks;
};

struct dir {
    const char *name;
    int in_fd, out_fd;
    uint64_t delay_ns, jitter_ns;
    double loss, ackloss;
    struct pkt *ring; /* FIFO: release times never decrease */
    unsigned char *slots; /* cap slots of g.slot bytes each */
    size_t cap, head, count;
    uint64_t last_release_ns;
    struct counters c;
    struct port_counters port[MAX_PORTS];
};

static struct {
    size_t slot; /* --mtu + 1: a read that fills a slot was cut short */
    bool drop_all;
    uint32_t drop_ip[MAX_DROP_IPS]; /* network order; 0 = free slot */
    uint16_t port[MAX_PORTS]; /* counted apart; 0 = free slot */
    uint64_t rng;
} g;

static uint64_t now_ns(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* splitmix64: tiny and good enough for loss draws; seeded, so a run's
 * losses repeat for the same packet sequence. */
static uint64_t rng_next(void)
{
    uint64_t z = (g.rng += 0x9e3779b97f4a7c15u);

    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

static double rng_unit(void)
{
    return (double)(rng_next() >> 11) * 0x1.0p-53;
}

/* A draw is taken only when the rate is set, so a cell without loss does
 * not shift the sequence another cell's losses come from. */
static bool chance(double p)
{
    return p > 0 && rng_unit() < p;
}

/* A TCP segment with no payload and no SYN, FIN or RST: losing one costs
 * the sender nothing but the knowledge that its data arrived. */
static bool is_pure_ack(const unsigned char *p, size_t len)
{
    size_t ihl = (size_t)(p[0] & 0x0f) * 4, total = (size_t)p[2] << 8 | p[3], doff;
    const unsigned char *t;

    if (p[9] != IPPROTO_TCP || ihl < 20 || total > len || total < ihl + 20)
        return false;
    if (((p[6] & 0x1f) << 8 | p[7]) != 0) /* a later fragment: no TCP header */
        return false;
    t = p + ihl;
    doff = (size_t)(t[12] >> 4) * 4;
    if (doff < 20 || ihl + doff != total)
        return false;
    return (t[13] & TCP_ACK) && !(t[13] & (TCP_SYN | TCP_FIN | TCP_RST));
}

/* A TCP segment that carries data (the wire counts them, per direction). */
static bool has_payload(const unsigned char *p, size_t len)
{
    size_t ihl = (size_t)(p[0] & 0x0f) * 4, total = (size_t)p[2] << 8 | p[3];

    if (p[9] != IPPROTO_TCP || ihl < 20 || total > len || total < ihl + 20)
        return false;
    if (((p[6] & 0x1f) << 8 | p[7]) != 0)
        return false;
    return total > ihl + (size_t)(p[ihl + 12] >> 4) * 4;
}

/* The counted port slot a packet out belongs to, or -1. */
static int port_slot(const unsigned char *p, size_t len)
{
    size_t ihl = (size_t)(p[0] & 0x0f) * 4;
    uint16_t sport, dport;

    if (p[9] != IPPROTO_TCP || ihl < 20 || len < ihl + 4 || ((p[6] & 0x1f) << 8 | p[7]) != 0)
        return -1;
    sport = (uint16_t)(p[ihl] << 8 | p[ihl + 1]);
    dport = (uint16_t)(p[ihl + 2] << 8 | p[ihl + 3]);
    for (int i = 0; i < MAX_PORTS; i++)
        if (g.port[i] != 0 && (g.port[i] == sport || g.port[i] == dport))
            return i;
    return -1;
}

static bool blackholed(const unsigned char *p)
{
    uint32_t src, dst;

    if (g.drop_all)
        return true;
    memcpy(&src, p + 12, 4);
    memcpy(&dst, p + 16, 4);
    for (int i = 0; i < MAX_DROP_IPS; i++)
        if (g.drop_ip[i] != 0 && (g.drop_ip[i] == src || g.drop_ip[i] == dst))
            return true;
    return false;
}

/* Reads every packet waiting on <d>'s input and queues the survivors. */
static void take_in(struct dir *d)
{
    for (;;) {
        size_t at = (d->head + d->count) % d->cap;
        struct pkt *slot = &d->ring[at];
        static unsigned char spill[MTU_MAX + 1];
        bool room = d->count < d->cap;
        /* With the ring full the packet is still read, so the device's own
         * queue does not hide the overflow from the counters. */
        unsigned char *buf = room ? d->slots + at * g.slot : spill;
        ssize_t n = read(d->in_fd, buf, g.slot);
        uint64_t now, release;

        if (n < 0) {
            if (errno != EAGAIN && errno != EINTR)
                d->c.werr++;
            return;
        }
        d->c.in++;
        if (n < 20 || (size_t)n >= g.slot || (buf[0] >> 4) != 4) {
            d->c.other++;
            continue;
        }
        if (blackholed(buf)) {
            d->c.dropped++;
            continue;
        }
        if (chance(d->loss)) {
            d->c.lost++;
            continue;
        }
        if (is_pure_ack(buf, (size_t)n)) {
            d->c.acks++;
            if (chance(d->ackloss)) {
                d->c.acklost++;
                continue;
            }
        }
        if (!room) {
            d->c.full++;
            continue;
        }
        now = now_ns();
        release = now + d->delay_ns +
                  (d->jitter_ns ? rng_next() % (d->jitter_ns + 1) : 0);
        /* Jitter stretches gaps but never reorders a direction: TCP would
         * take reordering for loss, which is a different impairment. */
        if (release < d->last_release_ns)
            release = d->last_release_ns;
        d->last_release_ns = release;
        slot->release_ns = release;
        slot->len = (size_t)n;
        d->count++;
    }
}

/* Writes out every queued packet that is due; returns nanoseconds until
 * the next one is, or UINT64_MAX with none queued. */
static uint64_t send_due(struct dir *d)
{
    uint64_t now = now_ns();

    while (d->count > 0) {
        struct pkt *p = &d->ring[d->head];
        unsigned char *data = d->slots + d->head * g.slot;

        if (p->release_ns > now)
            return p->release_ns - now;
        /* Checked again on the way out: a peer that vanishes takes the
         * packets still on the wire with it. */
        if (blackholed(data)) {
            d->c.dropped++;
        } else if (write(d->out_fd, data, p->len) == (ssize_t)p->len) {
            int at = port_slot(data, p->len);

            d->c.out++;
            d->c.bytes += p->len;
            d->c.segs += has_payload(data, p->len);
            if (at >= 0) {
                d->port[at].bytes += p->len;
                d->port[at].segs += has_payload(data, p->len);
                d->port[at].acks += is_pure_ack(data, p->len);
            }
        } else {
            d->c.werr++;
        }
        d->head = (d->head + 1) % d->cap;
        d->count--;
    }
    return UINT64_MAX;
}

/* Opens /dev/net/tun and creates device <dev> inside the namespace at
 * <ns>; the descriptor stays bound to that device wherever we go next.
 * Returns the descriptor, or -1 with a message printed. */
static int open_tun(const char *ns, const char *dev)
{
    char path[512];
    struct ifreq ifr;
    int nsfd, fd;

    snprintf(path, sizeof path, strchr(ns, '/') ? "%s" : "/var/run/netns/%s", ns);
    if (strlen(dev) >= IFNAMSIZ) {
        fprintf(stderr, "pl-wire: device name %s too long\n", dev);
        return -1;
    }
    nsfd = open(path, O_RDONLY | O_CLOEXEC);
    if (nsfd < 0 || setns(nsfd, CLONE_NEWNET) != 0) {
        fprintf(stderr, "pl-wire: entering %s: %s\n", path, strerror(errno));
        if (nsfd >= 0)
            close(nsfd);
        return -1;
    }
    close(nsfd);
    fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "pl-wire: /dev/net/tun: %s\n", strerror(errno));
        return -1;
    }
    memset(&ifr, 0, sizeof ifr);
    ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
    memcpy(ifr.ifr_name, dev, strlen(dev));
    if (ioctl(fd, TUNSETIFF, &ifr) != 0) {
        fprintf(stderr, "pl-wire: TUNSETIFF %s in %s: %s\n", dev, path, strerror(errno));
        close(fd);
        return -1;
    }
    return fd;
}

static void print_counters(const struct dir *d)
{
    const char *n = d->name;

    for (int i = 0; i < MAX_PORTS; i++)
        if (g.port[i] != 0)
            printf(" port%u_%s_bytes=%" PRIu64 " port%u_%s_segs=%" PRIu64
                   " port%u_%s_acks=%" PRIu64,
                   g.port[i], n, d->port[i].bytes, g.port[i], n, d->port[i].segs, g.port[i], n,
                   d->port[i].acks);

    printf(" %s_in=%" PRIu64 " %s_out=%" PRIu64 " %s_acks=%" PRIu64 " %s_lost=%" PRIu64
           " %s_acklost=%" PRIu64 " %s_dropped=%" PRIu64 " %s_full=%" PRIu64 " %s_other=%" PRIu64
           " %s_werr=%" PRIu64 " %s_bytes=%" PRIu64 " %s_segs=%" PRIu64,
           n, d->c.in, n, d->c.out, n, d->c.acks, n, d->c.lost, n, d->c.acklost, n, d->c.dropped,
           n, d->c.full, n, d->c.other, n, d->c.werr, n, d->c.bytes, n, d->c.segs);
}

/* Parses a number in [lo, hi]; false if <s> is not one. */
static bool parse_num(const char *s, double lo, double hi, double *out)
{
    char *end;

    if (s == NULL)
        return false;
    errno = 0;
    *out = strtod(s, &end);
    return errno == 0 && end != s && *end == '\0' && *out >= lo && *out <= hi;
}

static bool parse_onoff(const char *s, bool *on)
{
    if (s != NULL && strcmp(s, "on") == 0)
        *on = true;
    else if (s != NULL && strcmp(s, "off") == 0)
        *on = false;
    else
        return false;
    return true;
}

static const char *set_drop_ip(const char *addr, const char *onoff)
{
    struct in_addr a;
    bool on;
    int free_slot = -1;

    if (addr == NULL || inet_pton(AF_INET, addr, &a) != 1 || a.s_addr == 0)
        return "drop ip wants an IPv4 address";
    if (!parse_onoff(onoff, &on))
        return "drop ip ADDR wants on or off";
    for (int i = 0; i < MAX_DROP_IPS; i++) {
        if (g.drop_ip[i] == a.s_addr) {
            if (!on)
                g.drop_ip[i] = 0;
            return NULL;
        }
        if (g.drop_ip[i] == 0 && free_slot < 0)
            free_slot = i;
    }
    if (!on)
        return NULL;
    if (free_slot < 0)
        return "too many addresses dropped";
    g.drop_ip[free_slot] = a.s_addr;
    return NULL;
}

/* "count port N|off": N is counted apart from now on (from zero). */
static const char *set_count_port(struct dir *ab, struct dir *ba, const char *what,
                                  const char *arg)
{
    double v;
    int free_slot = -1;

    if (what == NULL || strcmp(what, "port") != 0)
        return "count wants port N or port off";
    if (arg != NULL && strcmp(arg, "off") == 0) {
        memset(g.port, 0, sizeof g.port);
        return NULL;
    }
    if (!parse_num(arg, 1, 65535, &v) || v != (double)(uint16_t)v)
        return "count port wants a port number (1..65535) or off";
    for (int i = 0; i < MAX_PORTS; i++) {
        if (g.port[i] == (uint16_t)v)
            return NULL;
        if (g.port[i] == 0 && free_slot < 0)
            free_slot = i;
    }
    if (free_slot < 0)
        return "too many ports counted";
    g.port[free_slot] = (uint16_t)v;
    memset(&ab->port[free_slot], 0, sizeof ab->port[free_slot]);
    memset(&ba->port[free_slot], 0, sizeof ba->port[free_slot]);
    return NULL;
}

/* Applies one parameter command to the directions <dirs> names. */
static const char *set_param(struct dir *ab, struct dir *ba, const char *what,
                             const char *dirs, const char *arg)
{
    struct dir *sel[2] = {NULL, NULL};
    bool rate = strcmp(what, "loss") == 0 || strcmp(what, "ackloss") == 0;
    double v;

    if (dirs == NULL)
        return "missing direction (ab, ba or both)";
    if (strcmp(dirs, "ab") == 0 || strcmp(dirs, "both") == 0)
        sel[0] = ab;
    if (strcmp(dirs, "ba") == 0 || strcmp(dirs, "both") == 0)
        sel[1] = ba;
    if (sel[0] == NULL && sel[1] == NULL)
        return "direction must be ab, ba or both";
    if (!parse_num(arg, 0, rate ? 1 : 60e6, &v))
        return rate ? "rate must be a number in 0..1" : "microseconds must be in 0..60000000";
    for (int i = 0; i < 2; i++) {
        struct dir *d = sel[i];

        if (d == NULL)
            continue;
        if (strcmp(what, "delay") == 0)
            d->delay_ns = (uint64_t)(v * 1000);
        else if (strcmp(what, "jitter") == 0)
            d->jitter_ns = (uint64_t)(v * 1000);
        else if (strcmp(what, "loss") == 0)
            d->loss = v;
        else
            d->ackloss = v;
    }
    return NULL;
}

/* Runs one command line; returns false on "quit". */
static bool command(struct dir *ab, struct dir *ba, char *line)
{
    char *save = NULL, *verb = strtok_r(line, " \t\r", &save);
    char *a1 = strtok_r(NULL, " \t\r", &save), *a2 = strtok_r(NULL, " \t\r", &save);
    char *a3 = strtok_r(NULL, " \t\r", &save);
    const char *err = NULL;
    double v;
    bool on;

    if (verb == NULL)
        return true; /* a blank line gets no answer: nothing was asked */
    if (strcmp(verb, "quit") == 0) {
        printf("ok\n");
        return false;
    }
    if (strcmp(verb, "delay") == 0 || strcmp(verb, "jitter") == 0 ||
        strcmp(verb, "loss") == 0 || strcmp(verb, "ackloss") == 0)
        err = set_param(ab, ba, verb, a1, a2);
    else if (strcmp(verb, "drop") == 0 && a1 != NULL && strcmp(a1, "all") == 0) {
        if (parse_onoff(a2, &on))
            g.drop_all = on;
        else
            err = "drop all wants on or off";
    } else if (strcmp(verb, "drop") == 0 && a1 != NULL && strcmp(a1, "ip") == 0)
        err = set_drop_ip(a2, a3);
    else if (strcmp(verb, "count") == 0)
        err = set_count_port(ab, ba, a1, a2);
    else if (strcmp(verb, "seed") == 0) {
        if (parse_num(a1, 0, 9007199254740992.0, &v))
            g.rng = (uint64_t)v;
        else
            err = "seed wants a number";
    } else if (strcmp(verb, "reset") == 0) {
        memset(&ab->c, 0, sizeof ab->c);
        memset(&ba->c, 0, sizeof ba->c);
        memset(ab->port, 0, sizeof ab->port);
        memset(ba->port, 0, sizeof ba->port);
    } else if (strcmp(verb, "stats") == 0) {
        printf("ok");
        print_counters(ab);
        print_counters(ba);
        printf(" queued=%zu\n", ab->count + ba->count);
        return true;
    } else
        err = "unknown command";
    if (err != NULL)
        printf("error %s\n", err);
    else
        printf("ok\n");
    return true;
}

/* Reads what stdin has and runs each complete line; false at end of input
 * or on "quit". */
static bool take_commands(struct dir *ab, struct dir *ba)
{
    static char buf[4096];
    static size_t used;
    ssize_t n = read(STDIN_FILENO, buf + used, sizeof buf - 1 - used);
    char *start = buf, *nl;

    if (n <= 0)
        return n < 0 && errno == EINTR;
    used += (size_t)n;
    buf[used] = '\0';
    while ((nl = strchr(start, '\n')) != NULL) {
        *nl = '\0';
        if (!command(ab, ba, start))
            return false;
        start = nl + 1;
    }
    used -= (size_t)(start - buf);
    memmove(buf, start, used);
    if (used == sizeof buf - 1) { /* a line longer than any command */
        printf("error line too long\n");
        used = 0;
    }
    return true;
}

static int usage(void)
{
    fprintf(stderr, "usage: pl-wire [--seed N] [--max-runtime-s S] [--queue N] [--mtu N] "
                    "NS_A DEV_A NS_B DEV_B\n");
    return 2;
}

int main(int argc, char **argv)
{
    uint64_t seed = 1;
    double runtime_s = 600, queue = 4096, mtu = 1500;
    struct dir ab = {.name = "ab"}, ba = {.name = "ba"};
    pid_t parent = getppid();
    int i, fa, fb, self_ns;

    for (i = 1; i + 1 < argc && strncmp(argv[i], "--", 2) == 0; i += 2) {
        double v;

        if (strcmp(argv[i], "--seed") == 0 && parse_num(argv[i + 1], 0, 9007199254740992.0, &v))
            seed = (uint64_t)v;
        else if (strcmp(argv[i], "--max-runtime-s") == 0 &&
                 parse_num(argv[i + 1], 1, 86400, &runtime_s))
            ;
        else if (strcmp(argv[i], "--queue") == 0 && parse_num(argv[i + 1], 1, 1 << 20, &queue))
            ;
        else if (strcmp(argv[i], "--mtu") == 0 && parse_num(argv[i + 1], 68, MTU_MAX, &mtu))
            ;
        else
            return usage();
    }
    if (argc - i != 4)
        return usage();

    /* Never outlive the test that started us, whatever happens to it. */
    if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0 || getppid() != parent)
        return 1;
    alarm((unsigned)runtime_s);
    /* The default 50 us of timer slack would be a quarter of a 0.2 ms RTT. */
    prctl(PR_SET_TIMERSLACK, 1UL);
    g.rng = seed;
    g.slot = (size_t)mtu + 1;
    setvbuf(stdout, NULL, _IOLBF, 0);

    self_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    fa = open_tun(argv[i], argv[i + 1]);
    fb = fa < 0 ? -1 : open_tun(argv[i + 2], argv[i + 3]);
    if (fb < 0)
        return 1;
    /* Back home: the devices keep their namespaces; we need none. */
    if (self_ns >= 0) {
        if (setns(self_ns, CLONE_NEWNET) != 0)
            fprintf(stderr, "pl-wire: returning to own namespace: %s\n", strerror(errno));
        close(self_ns);
    }

    ab.in_fd = ba.out_fd = fa;
    ab.out_fd = ba.in_fd = fb;
    ab.cap = ba.cap = (size_t)queue;
    ab.ring = calloc(ab.cap, sizeof *ab.ring);
    ba.ring = calloc(ba.cap, sizeof *ba.ring);
    /* Untouched slots cost no memory: calloc maps large blocks lazily. */
    ab.slots = calloc(ab.cap, g.slot);
    ba.slots = calloc(ba.cap, g.slot);
    if (ab.ring == NULL || ba.ring == NULL || ab.slots == NULL || ba.slots == NULL) {
        fprintf(stderr, "pl-wire: out of memory for %zu-packet queues\n", ab.cap);
        return 1;
    }
    printf("ready\n");

    for (;;) {
        struct pollfd fds[3] = {{.fd = fa, .events = POLLIN},
                                {.fd = fb, .events = POLLIN},
                                {.fd = STDIN_FILENO, .events = POLLIN}};
        uint64_t wait_a = send_due(&ab), wait_b = send_due(&ba);
        uint64_t wait = wait_a < wait_b ? wait_a : wait_b;
        struct timespec ts = {.tv_sec = (time_t)(wait / 1000000000u),
                              .tv_nsec = (long)(wait % 1000000000u)};

        /* ppoll, not poll: a 0.1 ms delay needs a timeout finer than 1 ms. */
        if (ppoll(fds, 3, wait == UINT64_MAX ? NULL : &ts, NULL) < 0 && errno != EINTR)
            break;
        if (fds[0].revents & POLLIN)
            take_in(&ab);
        if (fds[1].revents & POLLIN)
            take_in(&ba);
        if ((fds[0].revents | fds[1].revents) & (POLLERR | POLLHUP | POLLNVAL))
            break;
        if (fds[2].revents && !take_commands(&ab, &ba))
            break;
    }
    free(ab.ring);
    free(ba.ring);
    free(ab.slots);
    free(ba.slots);
    close(fa);
    close(fb);
    return 0;
}
