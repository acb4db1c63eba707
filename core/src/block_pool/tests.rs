//! `insert_hash`, the primary-hash insertion of vLLM's `_insert_block_hash`.

use super::*;

#[test]
fn insert_hash_sets_a_primary_hash_once_without_events() {
    let mut c = BlockPoolConfig::new(4, true);
    c.enable_events = true;
    let mut p = BlockPool::<BlockKey>::new(c).unwrap();
    let a = BlockKey::new(0xa, 0);
    assert_eq!(p.insert_hash(2, a, 16), Ok(true));
    assert_eq!(
        p.block_hash(2),
        Some(BlockHash {
            key: a,
            num_tokens: 16
        })
    );
    assert_eq!(p.get_one_block(&a), Some(2));
    // The same key again changes nothing; another key is refused (vLLM would keep it as a
    // secondary hash).
    assert_eq!(p.insert_hash(2, a, 32), Ok(false));
    assert_eq!(p.block_hash(2).map(|h| h.num_tokens), Some(16));
    assert_eq!(
        p.insert_hash(2, BlockKey::new(0xb, 0), 16),
        Err(InsertHashError::AlreadyHashed { block: 2 })
    );
    assert_eq!(p.insert_hash(0, a, 16), Err(InsertHashError::NullBlock));
    assert!(matches!(
        p.insert_hash(4, a, 16),
        Err(InsertHashError::OutOfRange(_))
    ));
    assert_eq!(p.take_events().count(), 0);
    // A second block under the same key chains behind the first.
    assert_eq!(p.insert_hash(3, a, 16), Ok(true));
    assert_eq!(p.get_one_block(&a), Some(2));
    // Handing the block out evicts its hash like any other.
    let mut got = alloc::vec::Vec::new();
    p.get_new_blocks(3, |b| got.push(b)).unwrap();
    assert_eq!(got, [1, 2, 3]);
    assert_eq!(p.get_one_block(&a), None);
}
