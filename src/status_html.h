/* status_html.h -- the status page's template, built into the binary from
 * src/status.html by src/embed_page.py (meson generates status_html.c). */
#ifndef PILOTLIGHT_STATUS_HTML_H
#define PILOTLIGHT_STATUS_HTML_H

#include <stddef.h>

/* The template's bytes: status_page.c fills each <!--@name--> in. */
extern const char pl_status_html[];
extern const size_t pl_status_html_len;

/* The page's Content-Security-Policy: its one script and its one style
 * sheet by their SHA-256, fetches to its own origin, nothing else. */
extern const char pl_status_html_csp[];

#endif
