/* segs.h -- data segments received on a socket (segs.c). */
#ifndef UNIT_SEGS_H
#define UNIT_SEGS_H

/* The data segments <fd> has received so far (TCP_INFO's tcpi_data_segs_in), or -1
 * when the kernel does not count them. */
long unit_segs_in(int fd);

#endif
