/* segs.c -- how many data segments a socket has received, from the kernel's
 * own TCP_INFO (linux/tcp.h's: glibc's struct tcp_info stops short of the
 * count, and the two headers cannot meet in one file). */
#include <stddef.h>
#include <string.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <linux/tcp.h>

#include "segs.h"

long unit_segs_in(int fd)
{
    struct tcp_info ti;
    socklen_t len = sizeof(ti);

    memset(&ti, 0, sizeof(ti));
    if (getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &len) != 0 ||
        len < offsetof(struct tcp_info, tcpi_data_segs_in) + sizeof(ti.tcpi_data_segs_in))
        return -1;
    return (long)ti.tcpi_data_segs_in;
}
