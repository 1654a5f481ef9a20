/* test_handover.c -- the upgrade's hand-over format: round trips, bounds,
 * hostile messages, and descriptors across a real socketpair. */
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include "pilotlight/handover.h"
#include "unit.h"

static pl_handover_rec parked(const char *dep, const char *ver, const char *id, int fd)
{
    pl_handover_rec r = {.type = PL_HO_PARKED, .serves = 1, .keep_alive = 1,
                         .age_ms = 1234, .ka_idle_s = 10, .ka_interval_s = 5,
                         .ka_count = 3, .user_timeout_ms = 25000, .fd = fd};

    r.key.deployment = dep;
    r.key.deployment_len = strlen(dep);
    r.key.version = ver;
    r.key.version_len = strlen(ver);
    r.key.cpu = 0.25;
    r.key.memory = 1.5;
    r.id = id;
    r.id_len = strlen(id);
    return r;
}

static void test_round_trip(void)
{
    pl_handover_rec in[3] = {
        {.type = PL_HO_LISTENER, .serves = 3, .fd = 7},
        parked("deployment_a", "20261201.1", "controller-1", 8),
        {.type = PL_HO_END, .count = 2, .fd = -1},
    }, out[PL_HANDOVER_BATCH];
    char buf[PL_HANDOVER_MSG_MAX];
    size_t len = pl_handover_encode(in, 3, buf, sizeof(buf));

    CHECK(len > 0);
    CHECK_EQ(pl_handover_decode(buf, len, out), 3);
    CHECK_EQ(out[0].type, PL_HO_LISTENER);
    CHECK_EQ(out[0].serves, 3);
    CHECK_EQ(out[0].fd, -1); /* descriptors travel beside the bytes */
    CHECK_EQ(out[1].type, PL_HO_PARKED);
    CHECK_EQ(out[1].age_ms, 1234);
    CHECK_EQ(out[1].keep_alive, 1);
    CHECK_EQ(out[1].ka_idle_s, 10);
    CHECK_EQ(out[1].ka_interval_s, 5);
    CHECK_EQ(out[1].ka_count, 3);
    CHECK_EQ(out[1].user_timeout_ms, 25000);
    CHECK(out[1].key.cpu == 0.25 && out[1].key.memory == 1.5);
    CHECK_EQ(out[1].key.deployment_len, 12);
    CHECK(memcmp(out[1].key.deployment, "deployment_a", 12) == 0);
    CHECK(memcmp(out[1].key.version, "20261201.1", 10) == 0);
    CHECK(out[1].id_len == 12 && memcmp(out[1].id, "controller-1", 12) == 0);
    CHECK_EQ(out[2].type, PL_HO_END);
    CHECK_EQ(out[2].count, 2);
}

static void test_bounds(void)
{
    char big[PL_HANDOVER_ID_MAX + 1], buf[PL_HANDOVER_MSG_MAX];
    pl_handover_rec r[PL_HANDOVER_BATCH + 1];

    memset(big, 'x', sizeof(big));
    big[PL_HANDOVER_ID_MAX] = '\0';
    r[0] = parked("d", "v", big, 3);
    CHECK(pl_handover_encode(r, 1, buf, sizeof(buf)) > 0); /* the longest id */
    r[0].id_len = PL_HANDOVER_ID_MAX + 1;
    CHECK_EQ(pl_handover_encode(r, 1, buf, sizeof(buf)), 0);
    for (int i = 0; i <= PL_HANDOVER_BATCH; i++)
        r[i] = (pl_handover_rec){.type = PL_HO_IDLE, .fd = 3};
    CHECK_EQ(pl_handover_encode(r, PL_HANDOVER_BATCH + 1, buf, sizeof(buf)), 0);
    CHECK(pl_handover_encode(r, PL_HANDOVER_BATCH, buf, sizeof(buf)) > 0);
    CHECK_EQ(pl_handover_encode(r, 1, buf, 12), 0); /* no room for a record */
}

static void test_hostile_messages_are_refused(void)
{
    pl_handover_rec in[2] = {parked("dep", "ver", "id", 3),
                             {.type = PL_HO_END, .count = 1}},
                    out[PL_HANDOVER_BATCH];
    char buf[PL_HANDOVER_MSG_MAX], bad[PL_HANDOVER_MSG_MAX];
    size_t len = pl_handover_encode(in, 2, buf, sizeof(buf));

    CHECK_EQ(pl_handover_decode(buf, len, out), 2);
    /* every truncation of a valid message is refused */
    for (size_t cut = 0; cut < len; cut++)
        CHECK_EQ(pl_handover_decode(buf, cut, out), -EPROTO);
    /* magic, version, record count, an unknown type */
    size_t at[] = {0, 4, 6, 14};
    for (size_t i = 0; i < sizeof(at) / sizeof(at[0]); i++) {
        memcpy(bad, buf, len);
        bad[at[i]] ^= 0x40;
        CHECK_EQ(pl_handover_decode(bad, len, out), -EPROTO);
    }
    /* a string length running past its record */
    memcpy(bad, buf, len);
    bad[12 + 2 + 3 + 8 + 16 + 16] = (char)0xff;
    CHECK_EQ(pl_handover_decode(bad, len, out), -EPROTO);
    /* every byte flipped: refused or decoded within bounds, never past them */
    for (size_t i = 0; i < len; i++) {
        memcpy(bad, buf, len);
        bad[i] ^= 0xff;
        int n = pl_handover_decode(bad, len, out);
        CHECK(n == -EPROTO || (n >= 0 && n <= PL_HANDOVER_BATCH));
        for (int k = 0; k < n; k++)
            if (out[k].type == PL_HO_PARKED)
                CHECK(out[k].key.deployment + out[k].key.deployment_len <= bad + len);
    }
}

static void test_descriptors_cross_a_socketpair(void)
{
    int sv[2], pipefd[2];
    pl_handover_rec in[3], out[PL_HANDOVER_BATCH];
    char buf[PL_HANDOVER_MSG_MAX], got;

    CHECK_EQ(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
    CHECK_EQ(pipe(pipefd), 0);
    in[0] = (pl_handover_rec){.type = PL_HO_IDLE, .serves = 2, .fd = pipefd[0]};
    in[1] = parked("dep", "ver", "ctl", pipefd[0]);
    in[2] = (pl_handover_rec){.type = PL_HO_END, .count = 2, .fd = -1};
    CHECK_EQ(pl_handover_send(sv[0], in, 3), 0);
    CHECK_EQ(pl_handover_recv(sv[1], out, buf), 3);
    CHECK(out[0].fd >= 0 && out[1].fd >= 0 && out[0].fd != pipefd[0]);
    CHECK_EQ(out[2].fd, -1);
    CHECK(fcntl(out[0].fd, F_GETFD) & FD_CLOEXEC);
    /* the received descriptors are the same pipe */
    CHECK_EQ(write(pipefd[1], "z", 1), 1);
    CHECK_EQ(read(out[1].fd, &got, 1), 1);
    CHECK_EQ(got, 'z');
    close(out[0].fd);
    close(out[1].fd);
    /* a record that should carry a descriptor but has none: refused */
    CHECK(pl_handover_encode(in, 1, buf, sizeof(buf)) > 0);
    size_t len = pl_handover_encode(in, 1, buf, sizeof(buf));
    CHECK_EQ(send(sv[0], buf, len, 0), (ssize_t)len);
    CHECK_EQ(pl_handover_recv(sv[1], out, buf), -EPROTO);
    /* end of file */
    close(sv[0]);
    CHECK_EQ(pl_handover_recv(sv[1], out, buf), 0);
    close(sv[1]);
    close(pipefd[0]);
    close(pipefd[1]);
}

int main(void)
{
    RUN(test_round_trip);
    RUN(test_bounds);
    RUN(test_hostile_messages_are_refused);
    RUN(test_descriptors_cross_a_socketpair);
    return unit_finish();
}
