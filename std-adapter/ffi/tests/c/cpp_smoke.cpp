// The header compiles as C++ (cbindgen's cpp_compat wraps it in extern "C") and the library
// links into a C++ program: one store and one load through the ABI, RAII for the handle.
#include <cstdio>
#include <memory>

#include "kvtier.h"

namespace {
struct Free {
    void operator()(kvtier_manager *m) const { kvtier_manager_free(m); }
};
using Manager = std::unique_ptr<kvtier_manager, Free>;

int fail(int rc, const char *what) {
    std::fprintf(stderr, "%s: %s (%s)\n", what, kvtier_status_message(rc), kvtier_last_error());
    return 1;
}
}  // namespace

int main() {
    kvtier_config cfg;
    if (int rc = kvtier_config_init(&cfg, 8)) return fail(rc, "config_init");
    cfg.policy = KVTIER_POLICY_ARC;
    kvtier_manager *raw = nullptr;
    if (int rc = kvtier_manager_new(&cfg, &raw)) return fail(rc, "manager_new");
    Manager m(raw);

    uint64_t req = 0;
    if (int rc = kvtier_request_begin(m.get(), &req)) return fail(rc, "request_begin");
    kvtier_key keys[2] = {{0xabc, 0}, {0xdef, 0}};
    kvtier_key stored[2], evicted[2];
    uint32_t slots[2];
    size_t n_stored = 0, n_evicted = 0;
    if (int rc = kvtier_prepare_store(m.get(), req, keys, 2, nullptr, stored, slots, 2, &n_stored,
                                      evicted, 2, &n_evicted))
        return fail(rc, "prepare_store");
    if (int rc = kvtier_complete_store(m.get(), stored, n_stored, KVTIER_STORE_SUCCEEDED))
        return fail(rc, "complete_store");
    uint32_t result = 0;
    if (int rc = kvtier_lookup(m.get(), &keys[1], &result)) return fail(rc, "lookup");
    if (int rc = kvtier_request_finish(m.get(), req)) return fail(rc, "request_finish");
    std::printf("c++: stored %zu in slots %u,%u; lookup %s\n", n_stored, slots[0], slots[1],
                result == KVTIER_LOOKUP_HIT ? "hit" : "miss");
    return result == KVTIER_LOOKUP_HIT && n_stored == 2 ? 0 : 1;
}
