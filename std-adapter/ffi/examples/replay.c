/*
 * replay TRACE [CAPACITY] [lru|arc] [STORE_THRESHOLD]
 *
 * Replays a kvtrace v1 file (docs/formats/kvtrace.md) through kvtier's C ABI and prints the hit digest
 * as 16 hex digits on stdout; the counts go to stderr. CAPACITY defaults to the trace header's
 * `capacity`, the policy to LRU, the store threshold to 0 (no filter).
 *
 *   cc std-adapter/ffi/examples/replay.c -I std-adapter/ffi/include \
 *      target/release/libkvtier_ffi.a -lpthread -ldl -lm -o replay
 *
 * Protocol per request: on `L`, begin a request, pin the leading HIT keys for loading
 * (kvtier_pin_hit_prefix: k keys) and fold k into the digest; on `S`, complete the loads
 * and offer the remaining keys (prepare_store; KVTIER_NO_ROOM counts a store failure); on `C`,
 * complete the stores and finish the request. Key i: its hash in group 0, end-token position
 * (i + 1) * block_tokens.
 */
#define _POSIX_C_SOURCE 200809L
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"

typedef struct {
    uint64_t rid;
    uint64_t req;
    kvtier_key *keys;
    uint64_t *ends;
    size_t n;
    size_t hits;
    kvtier_key *stored;
    size_t n_stored;
    int started;
} open_req;

typedef struct {
    uint64_t requests, request_blocks, hit_blocks, hit_requests, stored_blocks, evicted_blocks,
        store_failures, stopped_at_pending, digest;
} counts;

static unsigned long line_no;

static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "replay: line %lu: ", line_no);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(1);
}

static void check(int rc, const char *what) {
    if (rc != KVTIER_OK) {
        fail("%s: %s (%s)", what, kvtier_status_message(rc), kvtier_last_error());
    }
}

static void *xcalloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size);
    if (!p) fail("out of memory");
    return p;
}

/* Parses a decimal u64 at *p (at least one digit, no overflow) and advances past it. */
static int parse_dec(const char **p, uint64_t *out) {
    const char *s = *p;
    uint64_t v = 0;
    if (*s < '0' || *s > '9') return 0;
    while (*s >= '0' && *s <= '9') {
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return 0;
        v = v * 10 + d;
        s++;
    }
    *p = s;
    *out = v;
    return 1;
}

/* Parses exactly 16 lowercase hex digits at *p and advances past them. */
static int parse_hash(const char **p, uint64_t *out) {
    const char *s = *p;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++, s++) {
        int d;
        if (*s >= '0' && *s <= '9') d = *s - '0';
        else if (*s >= 'a' && *s <= 'f') d = *s - 'a' + 10;
        else return 0;
        v = (v << 4) | (uint64_t)d;
    }
    *p = s;
    *out = v;
    return 1;
}

/* A whole-string decimal u64. */
static int parse_dec_all(const char *s, uint64_t *out) {
    return parse_dec(&s, out) && *s == '\0';
}

static open_req *open_list;
static size_t n_open, cap_open;

static open_req *find_open(uint64_t rid) {
    for (size_t i = 0; i < n_open; i++) {
        if (open_list[i].rid == rid) return &open_list[i];
    }
    return NULL;
}

static void on_load(kvtier_manager *m, uint64_t rid, const char *p, uint64_t block_tokens,
                    counts *c) {
    uint64_t n;
    if (find_open(rid)) fail("request %" PRIu64 " arrived twice", rid);
    if (*p++ != ' ' || !parse_dec(&p, &n) || n == 0) fail("expected a block count >= 1");
    /* Each hash takes 17 bytes of the line, so n is bounded by the line's length. */
    if (n > strlen(p) / 17) fail("%" PRIu64 " hashes announced, fewer given", n);
    open_req r = {0};
    r.rid = rid;
    r.n = (size_t)n;
    r.keys = xcalloc(r.n, sizeof *r.keys);
    r.ends = xcalloc(r.n, sizeof *r.ends);
    r.stored = xcalloc(r.n, sizeof *r.stored);
    for (size_t i = 0; i < r.n; i++) {
        if (*p++ != ' ' || !parse_hash(&p, &r.keys[i].hash)) fail("bad hash %zu", i);
        r.keys[i].group = 0;
        r.ends[i] = (uint64_t)(i + 1) * block_tokens;
    }
    if (*p != '\0') fail("more hashes than announced");
    check(kvtier_request_begin(m, &r.req), "request_begin");
    /* The leading HITs, pinned in the same call (no eviction between a HIT and its pin). */
    uint32_t *slots = xcalloc(r.n, sizeof *slots);
    size_t k = 0;
    uint32_t stopped_at_pending = 0;
    check(kvtier_pin_hit_prefix(m, r.req, r.keys, r.n, r.ends, slots, r.n, &k,
                                &stopped_at_pending),
          "pin_hit_prefix");
    free(slots);
    if (stopped_at_pending) c->stopped_at_pending++;
    if (k > 0) c->hit_requests++;
    r.hits = k;
    c->requests++;
    c->request_blocks += r.n;
    c->hit_blocks += k;
    c->digest = c->digest * 1000003u + (uint64_t)k;
    if (n_open == cap_open) {
        size_t cap = cap_open ? cap_open * 2 : 64;
        open_req *grown = realloc(open_list, cap * sizeof *grown);
        if (!grown) fail("out of memory");
        open_list = grown;
        cap_open = cap;
    }
    open_list[n_open++] = r;
}

static void on_start(kvtier_manager *m, uint64_t rid, counts *c) {
    open_req *r = find_open(rid);
    if (!r) fail("request %" PRIu64 " is not open", rid);
    if (r->started) fail("request %" PRIu64 ": records out of order", rid);
    r->started = 1;
    if (r->hits > 0) check(kvtier_complete_load(m, r->keys, r->hits), "complete_load");
    if (r->hits == r->n) return;
    size_t offer = r->n - r->hits;
    uint32_t *slots = xcalloc(offer, sizeof *slots);
    kvtier_key *evicted = xcalloc(offer, sizeof *evicted);
    size_t stored_len = 0, evicted_len = 0;
    int rc = kvtier_prepare_store(m, r->req, r->keys + r->hits, offer, r->ends + r->hits,
                                  r->stored, slots, offer, &stored_len, evicted, offer,
                                  &evicted_len);
    if (rc == KVTIER_NO_ROOM) {
        c->store_failures++;
    } else {
        check(rc, "prepare_store");
        r->n_stored = stored_len;
        c->stored_blocks += stored_len;
        c->evicted_blocks += evicted_len;
    }
    free(slots);
    free(evicted);
}

static void on_complete(kvtier_manager *m, uint64_t rid) {
    open_req *r = find_open(rid);
    if (!r) fail("request %" PRIu64 " is not open", rid);
    if (!r->started) fail("request %" PRIu64 ": records out of order", rid);
    if (r->n_stored > 0) {
        check(kvtier_complete_store(m, r->stored, r->n_stored, KVTIER_STORE_SUCCEEDED),
              "complete_store");
    }
    check(kvtier_request_finish(m, r->req), "request_finish");
    free(r->keys);
    free(r->ends);
    free(r->stored);
    *r = open_list[--n_open];
}

int main(int argc, char **argv) {
    if (argc < 2 || argc > 5) {
        fprintf(stderr, "usage: %s TRACE [CAPACITY] [lru|arc] [STORE_THRESHOLD]\n", argv[0]);
        return 2;
    }
    uint64_t capacity = 0, threshold = 0, block_tokens = 16;
    int have_capacity = 0;
    uint32_t policy = KVTIER_POLICY_LRU;
    if (argc > 2) {
        if (!parse_dec_all(argv[2], &capacity) || capacity > UINT32_MAX) {
            fprintf(stderr, "replay: CAPACITY must be a number up to %" PRIu32 "\n", UINT32_MAX);
            return 2;
        }
        have_capacity = 1;
    }
    if (argc > 3) {
        if (strcmp(argv[3], "lru") == 0) policy = KVTIER_POLICY_LRU;
        else if (strcmp(argv[3], "arc") == 0) policy = KVTIER_POLICY_ARC;
        else {
            fprintf(stderr, "replay: the policy must be lru or arc\n");
            return 2;
        }
    }
    if (argc > 4 && (!parse_dec_all(argv[4], &threshold) || threshold > UINT32_MAX)) {
        fprintf(stderr, "replay: STORE_THRESHOLD must be a number up to %" PRIu32 "\n",
                UINT32_MAX);
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 1;
    }

    char *line = NULL;
    size_t line_cap = 0;
    ssize_t got;
    kvtier_manager *m = NULL;
    counts c = {0};
    while ((got = getline(&line, &line_cap, f)) != -1) {
        line_no++;
        if (got > 0 && line[got - 1] == '\n') line[--got] = '\0';
        if ((size_t)got != strlen(line)) fail("NUL byte in the line");
        if (line_no == 1) {
            if (strcmp(line, "# format=kvtrace v1") != 0) fail("not a kvtrace v1 file");
            continue;
        }
        if (line[0] == '#') {
            if (m) fail("header line after the first record");
            if (line[1] != ' ') fail("a header line starts with \"# \"");
            char *eq = strchr(line + 2, '=');
            if (!eq) fail("a header line holds key=value");
            *eq = '\0';
            uint64_t v;
            if (strcmp(line + 2, "capacity") == 0 && !have_capacity) {
                if (!parse_dec_all(eq + 1, &v) || v > UINT32_MAX) fail("bad capacity");
                capacity = v;
            } else if (strcmp(line + 2, "block_tokens") == 0) {
                if (!parse_dec_all(eq + 1, &v) || v == 0) fail("bad block_tokens");
                block_tokens = v;
            }
            continue;
        }
        if (!m) {
            kvtier_config cfg;
            check(kvtier_config_init(&cfg, (uint32_t)capacity), "config_init");
            cfg.policy = policy;
            cfg.store_threshold = (uint32_t)threshold;
            cfg.max_requests = 65536;
            check(kvtier_manager_new(&cfg, &m), "manager_new");
        }
        const char *p = line + 1;
        uint64_t rid;
        if ((line[0] != 'L' && line[0] != 'S' && line[0] != 'C') || *p++ != ' ' ||
            !parse_dec(&p, &rid)) {
            fail("expected `L|S|C <rid> ...`");
        }
        if (line[0] == 'L') {
            on_load(m, rid, p, block_tokens, &c);
        } else if (*p != '\0') {
            fail("trailing text after the request id");
        } else if (line[0] == 'S') {
            on_start(m, rid, &c);
        } else {
            on_complete(m, rid);
        }
    }
    free(line);
    fclose(f);
    if (line_no == 0) fail("empty file");
    if (n_open > 0) fail("request %" PRIu64 " left open at the end", open_list[0].rid);
    free(open_list);
    if (!m) fail("no records");

    kvtier_manager_info info;
    check(kvtier_inspect(m, &info), "inspect");
    size_t stats_cap = kvtier_stats_max_len(), stats_len = 0;
    uint8_t *stats = xcalloc(stats_cap, 1);
    check(kvtier_take_stats(m, stats, stats_cap, &stats_len), "take_stats");
    free(stats);
    check(kvtier_manager_free(m), "manager_free");

    printf("%016" PRIx64 "\n", c.digest);
    fprintf(stderr,
            "requests=%" PRIu64 " request_blocks=%" PRIu64 " hit_blocks=%" PRIu64
            " hit_requests=%" PRIu64 " stored_blocks=%" PRIu64 " evicted_blocks=%" PRIu64
            " store_failures=%" PRIu64 " stopped_at_pending=%" PRIu64
            " resident_blocks=%" PRIu32 " stats_bytes=%zu\n",
            c.requests, c.request_blocks, c.hit_blocks, c.hit_requests, c.stored_blocks,
            c.evicted_blocks, c.store_failures, c.stopped_at_pending, info.allocated,
            stats_len);
    return 0;
}
