/* test_notify.c -- the service manager's notification: one datagram to
 * NOTIFY_SOCKET, nothing without one. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sys/socket.h>
#include <sys/un.h>

#include "pilotlight/notify.h"
#include "unit.h"

static void test_without_a_manager(void)
{
    unsetenv("NOTIFY_SOCKET");
    CHECK_EQ(pl_notify("READY=1"), -ENOENT);
    setenv("NOTIFY_SOCKET", "relative/path", 1);
    CHECK_EQ(pl_notify("READY=1"), -ENOENT);
    unsetenv("NOTIFY_SOCKET");
}

/* A manager listening on a path (and on an abstract name) gets the state
 * as one datagram. */
static void test_to_a_manager(void)
{
    for (int abstract = 0; abstract <= 1; abstract++) {
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        char path[64], got[64];
        int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
        ssize_t n;

        snprintf(path, sizeof(path), "%s/tmp/pl-notify-%d", abstract ? "@" : "", (int)getpid());
        memcpy(sa.sun_path, path, strlen(path));
        if (abstract)
            sa.sun_path[0] = '\0';
        else
            unlink(path);
        CHECK(fd >= 0);
        CHECK_EQ(bind(fd, (struct sockaddr *)&sa,
                      (socklen_t)(offsetof(struct sockaddr_un, sun_path) + strlen(path))), 0);
        setenv("NOTIFY_SOCKET", path, 1);
        CHECK_EQ(pl_notify("READY=1"), 0);
        n = recv(fd, got, sizeof(got) - 1, MSG_DONTWAIT);
        CHECK_EQ(n, 7);
        got[n > 0 ? n : 0] = '\0';
        CHECK_STR(got, "READY=1");
        close(fd);
        if (!abstract)
            unlink(path);
    }
    unsetenv("NOTIFY_SOCKET");
}

int main(void)
{
    RUN(test_without_a_manager);
    RUN(test_to_a_manager);
    return unit_finish();
}
