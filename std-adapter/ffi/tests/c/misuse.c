/*
 * Misuse of the C ABI returns the documented statuses and changes nothing: NULL pointers,
 * short buffers, bad enum values, stale request ids, use after destroy. Exits 0 when every
 * check holds, 1 at the first that does not (naming it).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtier.h"

static int checks;

#define EXPECT(call, want)                                                                   \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        checks++;                                                                            \
        if (rc_ != (want)) {                                                                 \
            fprintf(stderr, "misuse.c:%d: %s returned %d (%s: %s), expected %s\n", __LINE__, \
                    #call, rc_, kvtier_status_message(rc_), kvtier_last_error(), #want);     \
            exit(1);                                                                         \
        }                                                                                    \
    } while (0)

#define TRUE(cond)                                                                 \
    do {                                                                           \
        checks++;                                                                  \
        if (!(cond)) {                                                             \
            fprintf(stderr, "misuse.c:%d: expected %s\n", __LINE__, #cond);        \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

static kvtier_key key(uint64_t h) {
    kvtier_key k = {h, 0};
    return k;
}

int main(void) {
    kvtier_config cfg;
    kvtier_manager *m = NULL;
    kvtier_manager_info info;

    /* Static messages for every status, and a fixed text for unknown codes. */
    TRUE(strcmp(kvtier_status_message(KVTIER_OK), "ok") == 0);
    TRUE(strcmp(kvtier_status_message(KVTIER_NULL_POINTER), "a required pointer argument is NULL") == 0);
    TRUE(strcmp(kvtier_status_message(12345), "unknown kvtier status code") == 0);
    TRUE(strcmp(kvtier_status_message(-1), "unknown kvtier status code") == 0);

    /* Construction. */
    EXPECT(kvtier_config_init(NULL, 4), KVTIER_NULL_POINTER);
    EXPECT(kvtier_config_init(&cfg, 4), KVTIER_OK);
    TRUE(cfg.num_chunks == 4 && cfg.policy == KVTIER_POLICY_LRU && cfg.max_requests == 4096);
    EXPECT(kvtier_manager_new(NULL, &m), KVTIER_NULL_POINTER);
    EXPECT(kvtier_manager_new(&cfg, NULL), KVTIER_NULL_POINTER);
    cfg.policy = 7;
    EXPECT(kvtier_manager_new(&cfg, &m), KVTIER_INVALID_ARGUMENT);
    TRUE(strstr(kvtier_last_error(), "policy is 7") != NULL);
    TRUE(m == NULL); /* not written on failure */
    cfg.policy = KVTIER_POLICY_LRU;
    cfg.enable_events = 2;
    EXPECT(kvtier_manager_new(&cfg, &m), KVTIER_INVALID_ARGUMENT);
    cfg.enable_events = 1;
    cfg.max_requests = 0;
    EXPECT(kvtier_manager_new(&cfg, &m), KVTIER_INVALID_CONFIG);
    TRUE(strcmp(kvtier_last_error(), "max_requests must be at least 1") == 0);
    cfg.max_requests = 2;
    cfg.memory_limit = 64; /* far below what 4 chunks need: refused before allocating */
    EXPECT(kvtier_manager_new(&cfg, &m), KVTIER_OUT_OF_MEMORY);
    TRUE(m == NULL);
    cfg.memory_limit = 0;
    EXPECT(kvtier_manager_new(&cfg, &m), KVTIER_OK);
    TRUE(m != NULL);

    /* NULL handle and NULL outputs. */
    uint64_t req = 0, req2 = 0, req3 = 0;
    uint32_t res = 99;
    kvtier_key k1 = key(1);
    EXPECT(kvtier_request_begin(NULL, &req), KVTIER_NULL_POINTER);
    EXPECT(kvtier_request_begin(m, NULL), KVTIER_NULL_POINTER);
    EXPECT(kvtier_lookup(m, NULL, &res), KVTIER_NULL_POINTER);
    EXPECT(kvtier_lookup(m, &k1, NULL), KVTIER_NULL_POINTER);
    EXPECT(kvtier_inspect(m, NULL), KVTIER_NULL_POINTER);
    EXPECT(kvtier_request_begin(m, &req), KVTIER_OK);
    EXPECT(kvtier_request_begin(m, &req2), KVTIER_OK);
    EXPECT(kvtier_request_begin(m, &req3), KVTIER_TOO_MANY_REQUESTS);
    EXPECT(kvtier_request_drop(m, req2), KVTIER_OK);
    EXPECT(kvtier_request_drop(m, req2), KVTIER_UNKNOWN_REQUEST);

    /* A store: NULL keys with a length, short buffers (needed length written, nothing
     * stored), then the real thing. */
    kvtier_key keys[3] = {key(1), key(2), key(3)};
    uint64_t ends[3] = {16, 32, 48};
    kvtier_key out_keys[3], evicted[3];
    uint32_t slots[3];
    size_t out_len = 0, evicted_len = 0;
    EXPECT(kvtier_prepare_store(m, req, NULL, 3, ends, out_keys, slots, 3, &out_len, evicted, 3,
                                &evicted_len),
           KVTIER_NULL_POINTER);
    EXPECT(kvtier_prepare_store(m, req, keys, 3, ends, NULL, slots, 3, &out_len, evicted, 3,
                                &evicted_len),
           KVTIER_NULL_POINTER);
    EXPECT(kvtier_prepare_store(m, req, keys, 3, ends, out_keys, slots, 3, NULL, evicted, 3,
                                &evicted_len),
           KVTIER_NULL_POINTER);
    EXPECT(kvtier_prepare_store(m, req, keys, 3, ends, out_keys, slots, 2, &out_len, evicted, 3,
                                &evicted_len),
           KVTIER_BUFFER_TOO_SMALL);
    TRUE(out_len == 3 && evicted_len == 3);
    EXPECT(kvtier_prepare_store(m, req, keys, 3, ends, out_keys, slots, 3, &out_len, evicted, 0,
                                &evicted_len),
           KVTIER_BUFFER_TOO_SMALL);
    EXPECT(kvtier_lookup(m, &k1, &res), KVTIER_OK);
    TRUE(res == KVTIER_LOOKUP_MISS); /* nothing was stored */
    EXPECT(kvtier_inspect(m, &info), KVTIER_OK);
    TRUE(info.allocated == 0);
    kvtier_key dup[2] = {key(1), key(1)};
    EXPECT(kvtier_prepare_store(m, req, dup, 2, NULL, out_keys, slots, 3, &out_len, evicted, 3,
                                &evicted_len),
           KVTIER_DUPLICATE_KEY);
    TRUE(strstr(kvtier_last_error(), "index 1") != NULL);
    uint64_t bad_ends[3] = {16, 32, UINT64_MAX};
    EXPECT(kvtier_prepare_store(m, req, keys, 3, bad_ends, out_keys, slots, 3, &out_len, evicted,
                                3, &evicted_len),
           KVTIER_BAD_POSITION);
    EXPECT(kvtier_prepare_store(m, req2, keys, 3, ends, out_keys, slots, 3, &out_len, evicted, 3,
                                &evicted_len),
           KVTIER_UNKNOWN_REQUEST);
    EXPECT(kvtier_prepare_store(m, req, keys, 3, ends, out_keys, slots, 3, &out_len, evicted, 3,
                                &evicted_len),
           KVTIER_OK);
    TRUE(out_len == 3 && evicted_len == 0 && slots[0] == 0 && slots[1] == 1 && slots[2] == 2);
    TRUE(out_keys[2].hash == 3);

    /* Loads of pending keys, a bad outcome, then completion. */
    size_t slots_len = 0;
    EXPECT(kvtier_prepare_load(m, req, keys, 1, NULL, slots, 1, &slots_len), KVTIER_NOT_READY);
    EXPECT(kvtier_complete_store(m, keys, 3, 2), KVTIER_INVALID_ARGUMENT);
    EXPECT(kvtier_complete_store(m, NULL, 3, KVTIER_STORE_SUCCEEDED), KVTIER_NULL_POINTER);
    EXPECT(kvtier_complete_store(m, NULL, 0, KVTIER_STORE_SUCCEEDED), KVTIER_OK);
    EXPECT(kvtier_complete_store(m, keys, 3, KVTIER_STORE_SUCCEEDED), KVTIER_OK);
    EXPECT(kvtier_prepare_load(m, req, keys, 3, ends, slots, 2, &slots_len),
           KVTIER_BUFFER_TOO_SMALL);
    TRUE(slots_len == 3);
    EXPECT(kvtier_inspect(m, &info), KVTIER_OK);
    TRUE(info.evictable == 3); /* nothing pinned by the refused load */
    kvtier_key absent = key(9);
    EXPECT(kvtier_prepare_load(m, req, &absent, 1, NULL, slots, 1, &slots_len),
           KVTIER_NOT_PRESENT);
    EXPECT(kvtier_complete_load(m, keys, 1), KVTIER_NOT_PINNED);
    EXPECT(kvtier_prepare_load(m, req, keys, 3, ends, slots, 3, &slots_len), KVTIER_OK);
    TRUE(slots_len == 3 && slots[0] == 0 && slots[2] == 2);
    EXPECT(kvtier_complete_load(m, keys, 3), KVTIER_OK);
    size_t hits = 0;
    uint32_t pending = 7;
    EXPECT(kvtier_pin_hit_prefix(m, req, keys, 3, ends, slots, 2, &hits, &pending),
           KVTIER_BUFFER_TOO_SMALL);
    TRUE(hits == 3 && pending == 7);
    EXPECT(kvtier_pin_hit_prefix(m, req, keys, 3, ends, slots, 3, NULL, &pending),
           KVTIER_NULL_POINTER);
    EXPECT(kvtier_inspect(m, &info), KVTIER_OK);
    TRUE(info.evictable == 3); /* nothing pinned by the refused calls */
    EXPECT(kvtier_pin_hit_prefix(m, req, keys, 3, ends, slots, 3, &hits, &pending), KVTIER_OK);
    TRUE(hits == 3 && pending == 0 && slots[1] == 1);
    EXPECT(kvtier_complete_load(m, keys, 3), KVTIER_OK);

    /* Events: short buffers keep them; the retry delivers them. */
    kvtier_event events[4];
    kvtier_key event_keys[8];
    size_t n_events = 0, n_event_keys = 0;
    EXPECT(kvtier_drain_events(m, events, 4, NULL, event_keys, 8, &n_event_keys),
           KVTIER_NULL_POINTER);
    EXPECT(kvtier_drain_events(m, events, 4, &n_events, event_keys, 1, &n_event_keys),
           KVTIER_BUFFER_TOO_SMALL);
    TRUE(n_events == 1 && n_event_keys == 3);
    EXPECT(kvtier_drain_events(m, events, 4, &n_events, event_keys, 8, &n_event_keys), KVTIER_OK);
    TRUE(n_events == 1 && n_event_keys == 3 && events[0].kind == KVTIER_EVENT_STORED);
    TRUE(events[0].first_key == 0 && events[0].num_keys == 3 && event_keys[1].hash == 2);

    /* Stats: a short buffer gives the needed length; the retry returns the bytes. */
    uint8_t stats[4096];
    size_t stats_len = 0;
    EXPECT(kvtier_take_stats(m, stats, 1, NULL), KVTIER_NULL_POINTER);
    EXPECT(kvtier_take_stats(m, NULL, 10, &stats_len), KVTIER_NULL_POINTER);
    EXPECT(kvtier_take_stats(m, stats, 1, &stats_len), KVTIER_BUFFER_TOO_SMALL);
    size_t needed = stats_len;
    TRUE(needed > 1 && needed <= sizeof stats && needed <= kvtier_stats_max_len());
    EXPECT(kvtier_take_stats(m, stats, sizeof stats, &stats_len), KVTIER_OK);
    TRUE(stats_len == needed && stats[0] == 1 /* wire format version */);

    /* Capacity: NULL and bad layouts. */
    kvtier_full_attention_layout layout = {32, 16, 8, 128, 2};
    kvtier_capacity_budget budget = {0};
    kvtier_capacity cap;
    budget.max_model_len = 8192;
    budget.max_num_batched_tokens = 2048;
    budget.gpu_memory_bytes = 70ull << 30;
    EXPECT(kvtier_capacity_full_attention(NULL, &budget, &cap), KVTIER_NULL_POINTER);
    EXPECT(kvtier_capacity_full_attention(&layout, &budget, NULL), KVTIER_NULL_POINTER);
    EXPECT(kvtier_capacity_full_attention(&layout, &budget, &cap), KVTIER_OK);
    TRUE(cap.bytes_per_block == 2097152 && cap.num_gpu_blocks == 35840);
    budget.gpu_memory_bytes = 64ull << 20;
    EXPECT(kvtier_capacity_full_attention(&layout, &budget, &cap), KVTIER_DOES_NOT_FIT);
    layout.num_layers = 0;
    EXPECT(kvtier_capacity_full_attention(&layout, &budget, &cap), KVTIER_INVALID_ARGUMENT);

    /* Use after destroy: detected, nothing dereferenced. */
    EXPECT(kvtier_request_finish(m, req), KVTIER_OK);
    EXPECT(kvtier_request_finish(m, req), KVTIER_UNKNOWN_REQUEST);
    EXPECT(kvtier_manager_free(m), KVTIER_OK);
    EXPECT(kvtier_manager_free(m), KVTIER_INVALID_HANDLE);
    EXPECT(kvtier_lookup(m, &k1, &res), KVTIER_INVALID_HANDLE);
    EXPECT(kvtier_request_begin(m, &req), KVTIER_INVALID_HANDLE);
    EXPECT(kvtier_reset_cache(m), KVTIER_INVALID_HANDLE);
    EXPECT(kvtier_manager_free(NULL), KVTIER_NULL_POINTER);
    /* A pointer that never was a handle. */
    int not_a_handle = 0;
    EXPECT(kvtier_reset_cache((kvtier_manager *)&not_a_handle), KVTIER_INVALID_HANDLE);

    printf("misuse: %d checks passed\n", checks);
    return 0;
}
