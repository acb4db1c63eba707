//! `insert_hash` and `insert_secondary_hash`, the primary and secondary insertions of vLLM's
//! `_insert_block_hash`.

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

#[test]
fn secondary_hashes_share_chains_and_leave_with_their_block() {
    let mut c = BlockPoolConfig::new(4, true);
    c.enable_events = true;
    c.secondary_capacity = 2;
    let mut p = BlockPool::<BlockKey>::new(c).unwrap();
    let (a, b, s) = (
        BlockKey::new(0xa, 0),
        BlockKey::new(0xb, 0),
        BlockKey::new(0x5, 0),
    );
    // A block without a hash takes the key as its hash, as vLLM's `_insert_block_hash`.
    assert_eq!(p.insert_secondary_hash(1, a, 32), Ok(true));
    assert_eq!(
        p.block_hash(1).map(|h| (h.key, h.num_tokens)),
        Some((a, 32))
    );
    // Block 2 holds b, then s as a secondary; block 1 then takes s too: block 2 answers s,
    // being first in its chain.
    assert_eq!(p.insert_hash(2, b, 32), Ok(true));
    assert_eq!(p.insert_secondary_hash(2, s, 0), Ok(true));
    assert_eq!(p.insert_secondary_hash(2, s, 0), Ok(false));
    assert_eq!(p.insert_secondary_hash(2, b, 0), Ok(false));
    assert_eq!(p.insert_secondary_hash(1, s, 0), Ok(true));
    assert_eq!(p.get_one_block(&s), Some(2));
    assert!(p.secondary_hashes(2).eq([s]));
    assert_eq!(
        p.insert_secondary_hash(3, BlockKey::new(0xc, 0), 0),
        Ok(true),
        "an unhashed block needs no room"
    );
    assert_eq!(
        p.insert_secondary_hash(3, s, 0),
        Err(InsertHashError::NoSecondaryRoom { block: 3 })
    );
    assert_eq!(
        p.insert_secondary_hash(0, s, 0),
        Err(InsertHashError::NullBlock)
    );
    // Evicting block 2 removes its hash then its secondary; block 1 answers s now.
    p.evict_blocks(&[2]).unwrap();
    assert_eq!(p.get_one_block(&s), Some(1));
    assert_eq!(p.get_one_block(&b), None);
    let removed: alloc::vec::Vec<_> = p.take_events().collect();
    assert_eq!(
        removed,
        [
            PoolEvent::Removed { key: b, block: 2 },
            PoolEvent::Removed { key: s, block: 2 }
        ]
    );
    // Its node is free again.
    assert_eq!(p.insert_secondary_hash(3, s, 0), Ok(true));
    assert!(p.secondary_hashes(3).eq([s]));
    // Handing block 1 out removes both of its keys.
    let mut got = alloc::vec::Vec::new();
    p.get_new_blocks(1, |x| got.push(x)).unwrap();
    assert_eq!(got, [1]);
    assert_eq!(p.get_one_block(&a), None);
    assert_eq!(p.get_one_block(&s), Some(3));
    p.free_blocks(&[1]).unwrap();
    assert!(p.reset_prefix_cache());
    assert_eq!(p.get_one_block(&s), None);
    assert_eq!(p.secondary_hashes(3).count(), 0);
    // After the reset both nodes are free.
    p.insert_hash(2, b, 32).unwrap();
    assert_eq!(p.insert_secondary_hash(2, s, 0), Ok(true));
    assert_eq!(p.insert_secondary_hash(2, a, 0), Ok(true));
    assert!(p.secondary_hashes(2).eq([s, a]));
}
