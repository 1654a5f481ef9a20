/* uvmem.h -- the pages libuv keeps that nobody uses.
 *
 * libuv's table of descriptors (8 B per descriptor, up to the highest one
 * ever open, rounded up to a power of two) grows with a crowd and never
 * shrinks: after 19,000 connections it stays 256 KiB, all of it resident,
 * though once they close nearly all of it is zeros. libuv allocates it
 * through the functions given to uv_replace_allocator(), so this module
 * installs its own, remembers libuv's largest reallocated block, and when
 * the transport trims its pools gives back the pages of that block that
 * hold only zeros: private anonymous pages read back as zeros after
 * MADV_DONTNEED, so libuv sees exactly the same memory. */
#ifndef PILOTLIGHT_UVMEM_H
#define PILOTLIGHT_UVMEM_H

/* Installs the allocator; before the first libuv call. Returns 0, or -1
 * when libuv had allocated already (then nothing is tracked). */
int pl_uvmem_install(void);

/* Gives back the all-zero pages of libuv's largest block. Cheap enough for
 * the pools' trim (a scan of that block), far too dear per request. */
void pl_uvmem_trim(void);

#endif
