//! Valid kvtrace record orders for property tests: every request's `L`, `S` and `C` at
//! increasing positions, the requests interleaved.

use std::collections::BTreeMap;

/// The interleaving of `keys.len() / 3` requests that sorting their `3 · n` events by `keys`
/// gives: `(op, rid)` with `op` 0 for `L`, 1 for `S`, 2 for `C`, each request's own events in
/// that order.
///
/// ```
/// let order = kvtier_tests::trace_order::interleave(&[5, 1, 9, 0, 7, 3]);
/// assert_eq!(order, [(0, 1), (0, 0), (1, 1), (1, 0), (2, 1), (2, 0)]);
/// ```
#[must_use]
pub fn interleave(keys: &[u32]) -> Vec<(u8, u64)> {
    let mut events: Vec<(u32, u64)> = keys
        .iter()
        .zip(0u64..)
        .take(keys.len() / 3 * 3)
        .map(|(&key, i)| (key, i / 3))
        .collect();
    events.sort_unstable();
    let mut next: BTreeMap<u64, u8> = BTreeMap::new();
    events
        .into_iter()
        .map(|(_, rid)| {
            let op = next.entry(rid).or_insert(0);
            let this = *op;
            *op += 1;
            (this, rid)
        })
        .collect()
}
