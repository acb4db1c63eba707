//! Shadows: where keys the LRU stack has moved really stand at some capacities, and the
//! capacities they make inexact (see the [module docs](super)).

use alloc::vec::Vec;

use super::flags::Flags;
use super::stamps::Stamps;

/// Where a key really stands at capacities `lo..hi` while the stack has moved it: at the stamp
/// before `mark`. Two kinds: a key refreshed by a request that did not observe it below `hi`
/// (its last refresh there is older; `owner` 0, retired when the key moves again, both
/// standing at the top then), and a key resident behind a miss of the open request `owner`
/// (`rid + 1`) at `lo..hi`, which keeps its old rank until that request's store phase.
/// Either is retired once every capacity it could mislead is marked inexact.
#[derive(Clone, Copy, Debug)]
struct Shadow {
    key: u64,
    id: u32,
    mark: u32,
    lo: u32,
    hi: u32,
    owner: u64,
}

/// The live shadows.
#[derive(Clone, Debug, Default)]
pub(crate) struct Shadows {
    list: Vec<Shadow>,
    ids: u32,
}

impl Shadows {
    /// Adds a shadow; its id, `None` when out of memory.
    pub(crate) fn push(
        &mut self,
        key: u64,
        mark: u32,
        lo: u32,
        hi: u32,
        owner: u64,
    ) -> Option<u32> {
        self.list.try_reserve(1).ok()?;
        self.ids = self.ids.wrapping_add(1).max(1);
        self.list.push(Shadow {
            key,
            id: self.ids,
            mark,
            lo,
            hi,
            owner,
        });
        Some(self.ids)
    }

    pub(crate) fn len(&self) -> usize {
        self.list.len()
    }

    /// The stamps the shadows remember (for a compaction).
    pub(crate) fn marks(&self) -> impl Iterator<Item = u32> + '_ {
        self.list.iter().map(|s| s.mark)
    }

    /// Renumbers the marks after a compaction: `old[i]` became `new[i]` (`old` sorted).
    pub(crate) fn translate(&mut self, old: &[u32], new: &[u32]) {
        for sh in &mut self.list {
            if let Ok(i) = old.binary_search(&sh.mark) {
                sh.mark = new[i];
            }
        }
    }

    /// At a store of request `rid` that stores `stored` keys: marks inexact the capacities of
    /// each live shadow whose eviction zone reaches it, retiring the stale ones (a refresh
    /// shadow whose key moved since — `refreshed(key, id)` is false — or a shadow of `rid`'s
    /// own, which its store protects and then ranks as the stack does) and those whose every
    /// capacity is marked.
    pub(crate) fn flag(
        &mut self,
        stored: u32,
        rid: u64,
        refreshed: impl Fn(&u64, u32) -> bool,
        stamps: &Stamps,
        flags: &mut Flags,
    ) {
        self.list.retain(|sh| {
            let live = if sh.owner == 0 {
                refreshed(&sh.key, sh.id)
            } else {
                sh.owner != rid + 1
            };
            if !live {
                return false;
            }
            let depth = stamps.at_or_after(sh.mark).saturating_add(1);
            let reach = depth.saturating_add(stored).saturating_add(1);
            flags.range(sh.lo, reach.min(sh.hi));
            reach < sh.hi
        });
    }
}
