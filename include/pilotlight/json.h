/* json.h -- the strict reader for every JSON document a client sends: dispatch
 * bodies (message.c) and deployment-token segments (token.c).
 *
 * One pass validates the document as RFC 8259 JSON that JavaScript's
 * JSON.parse reads the same way: UTF-8 without overlong forms, surrogates or
 * a BOM; only the four JSON whitespace bytes; numbers in JSON's grammar; no
 * raw control character in a string; nothing after the document; nesting at
 * most PL_JSON_MAX_DEPTH deep. No object may repeat a member name, names
 * compared decoded (JavaScript keeps the last of two, most C readers the
 * first: a repeat would let two readers see two documents).
 *
 * Nothing is built. The caller names the values it wants as paths of member
 * names (a small table), and gets each one's type and bytes in the document.
 * Typical documents use no heap: the member names go to a static table
 * (heap only past 1,024 names or 4 KiB of escaped names, freed before the
 * call returns). So the reader is for one thread, as the event loop is. */
#ifndef PILOTLIGHT_JSON_H
#define PILOTLIGHT_JSON_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

/* Deepest nesting of arrays and objects accepted. */
#define PL_JSON_MAX_DEPTH 1000

/* pl_json_read() results besides 0. */
#define PL_JSON_EINVAL (-EINVAL) /* not JSON: doc->error says what, doc->error_at where */
#define PL_JSON_EDUP (-EEXIST)   /* JSON, but an object repeats a member name (doc->dup) */
#define PL_JSON_ENOMEM (-ENOMEM) /* heap scratch for a very large document was refused */

typedef enum {
    PL_JSON_NONE, /* no value: the path was not in the document */
    PL_JSON_STRING,
    PL_JSON_NUMBER,
    PL_JSON_OBJECT,
    PL_JSON_ARRAY,
    PL_JSON_TRUE,
    PL_JSON_FALSE,
    PL_JSON_NULL,
} pl_json_type;

/* A value in the document. A string's bytes are those between its quotes,
 * as written (pl_json_string() decodes them); any other value's bytes are
 * its whole text, a container's from its bracket to the closing one. */
typedef struct {
    const char *p;
    size_t len;
    uint8_t type;    /* pl_json_type */
    uint8_t escaped; /* a string holding a backslash escape */
} pl_json_value;

/* One step towards a wanted value: the member <name> (<len> bytes, compared
 * with the decoded member names) of the object at <from>, which is
 * PL_JSON_ROOT for the document or 1 + the index of another path. Paths do
 * not go through arrays. */
typedef struct {
    uint8_t from;
    uint8_t len;
    const char *name;
} pl_json_path;

#define PL_JSON_ROOT 0
#define PL_JSON_PATHS_MAX 254

/* pl_json_read() flags. */
enum {
    /* Read the first value only: the bytes after it are not looked at, and
     * doc->end says where it ended. */
    PL_JSON_PREFIX = 1,
    /* Also refuse a string (value or name) holding \u0000 or a lone
     * surrogate, which JSON.parse reads but no C string or header carries. */
    PL_JSON_TEXT = 2,
};

/* What pl_json_read() found besides the wanted values. */
typedef struct {
    pl_json_value root;  /* the document's value (type NONE when not JSON) */
    size_t end;          /* bytes read: all of them, or the first value's */
    const char *error;   /* the first error (static text fit for a JSON
                          * string), or NULL */
    size_t error_at;     /* its byte offset */
    const char *dup;     /* the first repeated member name, as written */
    size_t dup_len;
} pl_json_doc;

/* Reads <text> (<len> bytes, need not be NUL-terminated) with <flags>. For
 * each of the <npaths> paths, found[i] receives the value at paths[i] (the
 * first one, should a name repeat), or type PL_JSON_NONE (always, for a
 * path past the first PL_JSON_PATHS_MAX). Values point into
 * <text>. Returns 0; PL_JSON_EINVAL for a document that is not JSON (a
 * syntax error is reported even after a repeated name); PL_JSON_EDUP for
 * JSON that repeats a member name (the values were all read); or
 * PL_JSON_ENOMEM. <doc> is filled in every case, found[] but for ENOMEM. */
int pl_json_read(const char *text, size_t len, unsigned flags, const pl_json_path *paths,
                 size_t npaths, pl_json_value *found, pl_json_doc *doc);

/* Decodes the string <v> (one pl_json_read() found) into <out>, <cap>
 * bytes: escapes decoded, a surrogate pair as its character, a lone
 * surrogate as the three bytes of its code unit, so that two strings decode
 * to the same bytes exactly when JavaScript's strings are equal. Returns the
 * length (at most v->len), -EINVAL when <v> is not a string, or -ENOSPC
 * when it does not fit. */
long pl_json_string(const pl_json_value *v, char *out, size_t cap);

/* 1 when <v> is a string whose decoded text is the <len> bytes <s>. */
int pl_json_equals(const pl_json_value *v, const char *s, size_t len);

/* 1 when decoded string bytes <s>,<len> are text a C string and a header
 * can carry: no NUL, no lone surrogate. */
int pl_json_is_text(const char *s, size_t len);

/* Sets *out to the number <v> as JavaScript reads it (correctly rounded).
 * <v> must be a member or element of a document pl_json_read() accepted (a
 * byte that ends the number follows it). Returns 0, -EINVAL when <v> is not
 * a number, or -ERANGE when it is beyond the double range. */
int pl_json_number(const pl_json_value *v, double *out);

/* Steps through the elements of the array <v> (one pl_json_read() found):
 * *cursor is NULL at first. Returns 1 with the next element in <out>, 0
 * after the last one (or when <v> is not an array), PL_JSON_ENOMEM when an
 * element is too large to read. */
int pl_json_element(const pl_json_value *v, const char **cursor, pl_json_value *out);

#endif
