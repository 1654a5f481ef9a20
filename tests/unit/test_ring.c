/* test_ring.c -- a key's owner among the instances: every instance agrees,
 * keys spread evenly, and a member joining or leaving moves only the keys
 * it must. */
#include <stdio.h>
#include <string.h>

#include "pilotlight/ring.h"
#include "unit.h"

#define KEYS 20000

static pl_key key_n(int i, char *buf, size_t cap)
{
    pl_key k;
    int n = snprintf(buf, cap, "deployment_%d", i);

    k.deployment = buf;
    k.deployment_len = (size_t)n;
    k.version = "20261204.1";
    k.version_len = 10;
    k.cpu = i % 4 == 0 ? 0.5 : 1;
    k.memory = 1;
    return k;
}

static void add(pl_ring *r, const char *name)
{
    CHECK_EQ(pl_ring_add(r, name, strlen(name)), 0);
}

static void test_members(void)
{
    pl_ring r;

    pl_ring_init(&r);
    add(&r, "10.0.0.2:8080");
    add(&r, "10.0.0.10:8080");
    add(&r, "10.0.0.1:8080");
    add(&r, "10.0.0.2:8080"); /* once */
    CHECK_EQ(r.n, 3);
    CHECK_STR(r.m[0].name, "10.0.0.10:8080");
    CHECK_STR(r.m[1].name, "10.0.0.1:8080");
    CHECK_STR(r.m[2].name, "10.0.0.2:8080");
    CHECK_EQ(pl_ring_find(&r, "10.0.0.1:8080", 13), 1);
    CHECK_EQ(pl_ring_find(&r, "10.0.0.1:80", 11), -ENOENT);
    CHECK_EQ(pl_ring_add(&r, "", 0), -EINVAL);
    {
        char longname[PL_RING_NAME_MAX + 1];
        memset(longname, 'a', sizeof(longname));
        CHECK_EQ(pl_ring_add(&r, longname, PL_RING_NAME_MAX), -EINVAL);
    }
    for (int i = (int)r.n; i < PL_RING_MEMBERS_MAX; i++) {
        char name[32];
        int len = snprintf(name, sizeof(name), "10.1.0.%d:80", i);
        CHECK_EQ(pl_ring_add(&r, name, (size_t)len), 0);
    }
    CHECK_EQ(pl_ring_add(&r, "10.2.0.1:80", 11), -ENOSPC);
    CHECK_EQ(pl_ring_add(&r, "10.0.0.1:8080", 13), 0); /* a member still */
}

/* The same members added in any order give every key the same owner:
 * what lets instances agree without talking. */
static void test_order_does_not_matter(void)
{
    static const char *names[] = {"a:1", "b:1", "c:1", "d:1"};
    pl_ring x, y;
    char buf[32];

    pl_ring_init(&x);
    pl_ring_init(&y);
    for (int i = 0; i < 4; i++) {
        add(&x, names[i]);
        add(&y, names[3 - i]);
    }
    CHECK(pl_ring_same(&x, &y));
    for (int i = 0; i < 1000; i++) {
        pl_key k = key_n(i, buf, sizeof(buf));
        uint64_t h = pl_ring_key_hash(&k);
        CHECK_STR(x.m[pl_ring_owner(&x, h)].name, y.m[pl_ring_owner(&y, h)].name);
    }
}

/* Keys that compare equal as keys (1 and 1.0) hash alike. */
static void test_equal_keys_agree(void)
{
    pl_key a = {"dep", 3, "v", 1, 1.0, 2.0}, b = {"dep", 3, "v", 1, 1, 2};

    CHECK_EQ(pl_ring_key_hash(&a), pl_ring_key_hash(&b));
}

/* Four members share the keys about evenly; a fifth takes about a fifth of
 * them, from every member, and no other key moves; one leaving gives its
 * keys away and no other key moves. */
static void test_spread_and_moves(void)
{
    static const char *names[] = {"10.1.0.1:8080", "10.1.0.2:8080", "10.1.0.3:8080",
                                  "10.1.0.4:8080", "10.1.0.5:8080"};
    pl_ring four, five;
    int count[5] = {0}, moved = 0, wrong = 0;
    char buf[32];

    pl_ring_init(&four);
    pl_ring_init(&five);
    for (int i = 0; i < 5; i++) {
        if (i < 4)
            add(&four, names[i]);
        add(&five, names[i]);
    }
    for (int i = 0; i < KEYS; i++) {
        pl_key k = key_n(i, buf, sizeof(buf));
        uint64_t h = pl_ring_key_hash(&k);
        const char *o4 = four.m[pl_ring_owner(&four, h)].name;
        const char *o5 = five.m[pl_ring_owner(&five, h)].name;
        count[pl_ring_owner(&five, h)]++;
        if (strcmp(o4, o5) != 0) {
            moved++;
            if (strcmp(o5, names[4]) != 0)
                wrong++; /* moved, but not to the newcomer */
        }
    }
    CHECK_EQ(wrong, 0);
    CHECK(moved > KEYS / 5 - KEYS / 50 && moved < KEYS / 5 + KEYS / 50);
    for (int i = 0; i < 5; i++)
        CHECK(count[i] > KEYS / 5 - KEYS / 50 && count[i] < KEYS / 5 + KEYS / 50);
}

/* Names as a URL carries them: host:port, an IPv6 host in brackets; no
 * byte that would change the URL a redirect names. */
static void test_split(void)
{
    static const char *bad[] = {
        "", "host", "host:", ":80", "host:0", "host:65536", "host:123456", "::1:80",
        "[::1]", "[::1]80", "h/st:80", "h?st:80", "h@st:80", "h st:80", "host:8a",
        "[::1:80", "ho\x01st:80",
    };
    char host[PL_RING_NAME_MAX];
    uint16_t port;

    CHECK_EQ(pl_ring_split("10.0.0.7:8080", 13, host, sizeof(host), &port), 0);
    CHECK_STR(host, "10.0.0.7");
    CHECK_EQ(port, 8080);
    CHECK_EQ(pl_ring_split("[fd00::7]:80", 12, host, sizeof(host), &port), 0);
    CHECK_STR(host, "fd00::7");
    CHECK_EQ(port, 80);
    CHECK_EQ(pl_ring_split("pilotlight-0.pilotlight:8080", 28, host, sizeof(host), &port), 0);
    CHECK_STR(host, "pilotlight-0.pilotlight");
    CHECK_EQ(pl_ring_split("10.0.0.7:8080", 13, host, 8, &port), -EINVAL); /* no room */
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = pl_ring_split(bad[i], strlen(bad[i]), host, sizeof(host), &port);
        if (rc != -EINVAL)
            fprintf(stderr, "  accepted \"%s\"\n", bad[i]);
        CHECK_EQ(rc, -EINVAL);
    }
}

static void count_name(const char *s, size_t len, void *arg)
{
    char *out = arg;

    strncat(out, s, len);
    strcat(out, "|");
}

/* The settings: a list or a name, and this instance among the list. */
static void test_check_config(void)
{
    char err[256], seen[128] = "";

    CHECK_EQ(pl_ring_each_name(" a:1,b:2 ,, c:3", count_name, seen), 3);
    CHECK_STR(seen, "a:1|b:2|c:3|");
    CHECK_EQ(pl_ring_check_config("", "", "", err, sizeof(err)), 0); /* no ring */
    CHECK_EQ(pl_ring_check_config("a:1,b:1", "", "b:1", err, sizeof(err)), 0);
    CHECK_EQ(pl_ring_check_config("", "peers.svc:8080", "", err, sizeof(err)), 0);
    CHECK_EQ(pl_ring_check_config("", "peers.svc:8080", "10.0.0.1:8080", err, sizeof(err)), 0);
    CHECK_EQ(pl_ring_check_config("a:1,b:1", "", "c:1", err, sizeof(err)), -EINVAL);
    CHECK(strstr(err, "ring_self") != NULL);
    CHECK_EQ(pl_ring_check_config("a:1,b:1", "", "", err, sizeof(err)), -EINVAL);
    CHECK_EQ(pl_ring_check_config("a:1,b", "", "a:1", err, sizeof(err)), -EINVAL);
    CHECK(strstr(err, "ring_peers") != NULL && strstr(err, "\"b\"") != NULL);
    CHECK_EQ(pl_ring_check_config("a:1", "n:1", "a:1", err, sizeof(err)), -EINVAL);
    CHECK_EQ(pl_ring_check_config("", "n", "", err, sizeof(err)), -EINVAL);
    CHECK(strstr(err, "ring_dns") != NULL);
    CHECK_EQ(pl_ring_check_config("", "", "a:1", err, sizeof(err)), -EINVAL);
    CHECK_EQ(pl_ring_check_config("", "n:1", "a", err, sizeof(err)), -EINVAL);
    {
        char many[PL_RING_MEMBERS_MAX * 16 + 16] = "", one[16];
        for (int i = 0; i <= PL_RING_MEMBERS_MAX; i++) {
            snprintf(one, sizeof(one), "%sh%d:1", i ? "," : "", i);
            strcat(many, one);
        }
        CHECK_EQ(pl_ring_check_config(many, "", "h0:1", err, sizeof(err)), -EINVAL);
        CHECK(strstr(err, "more than") != NULL);
    }
}

static int view_read(const char *v, int with_clock, pl_ring_view *out)
{
    return pl_ring_view_read(v, strlen(v), with_clock, out);
}

/* X-PL-Ring's two forms read strictly: what pl_redirect writes and
 * nothing near it (scanf would take a sign, a 0x, leading blanks, a
 * shorter digest, a name cut short). */
static void test_view_read(void)
{
    static const char *bad_check[] = {
        "", "0123456789abcdef", "0123456789abcdef ", "0123456789abcde a:1",
        "0123456789abcdef0 a:1", "0123456789ABCDEF a:1", "0x23456789abcdef a:1",
        " 0123456789abcdef a:1", "0123456789abcdef  a:1", "0123456789abcdef a:1 ",
        "0123456789abcdef a :1", "0123456789abcdef a:\x01", "0123456789abcdef a:\x7f",
        "0123456789abcdef a:\xc3\xa9",
    };
    static const char *bad_answer[] = {
        "0123456789abcdef a:1", "0123456789abcdef 12345678901234 a:1",
        "0123456789abcdef -1 a:1", "0123456789abcdef +1 a:1", "0123456789abcdef 1",
        "0123456789abcdef 1  a:1", "0123456789abcdef 1x a:1",
    };
    char name[PL_RING_NAME_MAX + 32];
    pl_ring_view v;

    CHECK_EQ(view_read("0123456789abcdef 127.0.0.1:8080", 0, &v), 0);
    CHECK(v.digest == 0x0123456789abcdefULL && v.ms == 0);
    CHECK_STR(v.name, "127.0.0.1:8080");
    CHECK_EQ(view_read("ffffffffffffffff 1764900000123 [::1]:9", 1, &v), 0);
    CHECK(v.digest == UINT64_MAX && v.ms == 1764900000123ULL);
    CHECK_STR(v.name, "[::1]:9");
    CHECK_EQ(view_read("0000000000000001 0 n", 1, &v), 0);
    CHECK(v.digest == 1 && v.ms == 0);
    for (size_t i = 0; i < sizeof(bad_check) / sizeof(bad_check[0]); i++)
        CHECK_EQ(view_read(bad_check[i], 0, &v), -EINVAL);
    for (size_t i = 0; i < sizeof(bad_answer) / sizeof(bad_answer[0]); i++)
        CHECK_EQ(view_read(bad_answer[i], 1, &v), -EINVAL);
    /* the name's length: up to PL_RING_NAME_MAX - 1 */
    memset(name, 'a', sizeof(name));
    memcpy(name, "0123456789abcdef ", 17);
    CHECK_EQ(pl_ring_view_read(name, 17 + PL_RING_NAME_MAX - 1, 0, &v), 0);
    CHECK_EQ(strlen(v.name), (size_t)PL_RING_NAME_MAX - 1);
    CHECK_EQ(pl_ring_view_read(name, 17 + PL_RING_NAME_MAX, 0, &v), -EINVAL);
    /* a NUL inside is not the end */
    CHECK_EQ(pl_ring_view_read("0123456789abcdef a\0b", 20, 0, &v), -EINVAL);
}

int main(void)
{
    RUN(test_members);
    RUN(test_order_does_not_matter);
    RUN(test_equal_keys_agree);
    RUN(test_spread_and_moves);
    RUN(test_split);
    RUN(test_check_config);
    RUN(test_view_read);
    return unit_finish();
}
