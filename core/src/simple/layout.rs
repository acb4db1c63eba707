//! The model's KV-cache groups as the simple scheduler sees them: one [`GroupKind`] per group,
//! in vLLM's group order ([`Layout`]).

use super::error::ConfigError;

/// The most KV-cache groups a [`Layout`] holds.
pub const MAX_GROUPS: usize = 8;

// `SpecGroup::members` holds one bit per group.
const _: () = assert!(MAX_GROUPS <= 8);

/// One KV-cache group's kind, as vLLM's spec class decides how the group is looked up and
/// stored. A group's block size is the scheduler's
/// ([`SimpleConfig::block_size`](super::SimpleConfig::block_size)) unless the layout gives it
/// its own ([`Layout::with_block_size`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum GroupKind {
    /// Full attention (`FullAttentionSpec`): a hit is the leading run of held blocks; the
    /// eager scan stores every confirmed block.
    FullAttention,
    /// Sliding-window attention (`SlidingWindowSpec`): a hit needs the last
    /// `cdiv(window − 1, block_size)` blocks before it (or every block from the start); the
    /// blocks before that run are not loaded. Table entries that left the window may be the
    /// null block: the eager scan stores them from the GPU's prefix cache while it holds them.
    SlidingWindow {
        /// The window in tokens (> 0).
        window: u32,
    },
    /// Chunked local attention (`ChunkedLocalAttentionSpec`): a hit needs the blocks of its
    /// last, partial chunk only; a lookup after computed tokens that are not chunk-aligned
    /// finds nothing.
    ChunkedLocal {
        /// The chunk in tokens (> 0).
        chunk: u32,
    },
    /// Mamba in vLLM's `align` mode (`MambaSpec`): a hit ends at a block whose state the pool
    /// holds; states reach the pool only as boundary hand-offs
    /// ([`StepInput::handoffs`](super::StepInput)) or lazily.
    Mamba,
    /// Not prefix-cacheable (a scratch or ring group): never looked up, stored or loaded; its
    /// presence makes the model a hybrid one (vLLM's `HybridKVCacheCoordinator`).
    Scratch,
}

impl GroupKind {
    /// Whether the group takes part in lookups, loads and stores (vLLM's `prefix_cacheable`).
    #[must_use]
    pub const fn is_cacheable(self) -> bool {
        !matches!(self, GroupKind::Scratch)
    }

    /// Whether the eager scan follows the group's table by position (vLLM's
    /// `has_positionally_stable_blocks`; `align`-mode Mamba tables are not).
    #[must_use]
    pub const fn is_positional(self) -> bool {
        matches!(
            self,
            GroupKind::FullAttention
                | GroupKind::SlidingWindow { .. }
                | GroupKind::ChunkedLocal { .. }
        )
    }
}

/// The model's KV-cache groups, in vLLM's group order: group `i` has kind `kinds()[i]`, and
/// its blocks are keyed `BlockKey::new(hash, i)`.
///
/// A valid layout has 1 to [`MAX_GROUPS`] groups, at least one of them
/// [`GroupKind::FullAttention`] (vLLM's scheduler needs its `fa_gidx`), and no window or chunk
/// of 0. One full-attention group alone is a dense model (vLLM's `UnitaryKVCacheCoordinator`);
/// anything else runs as vLLM's `HybridKVCacheCoordinator`.
///
/// Groups of one kind (and window, or chunk) and block size are looked up together, as one of
/// vLLM's spec groups. vLLM joins only groups whose whole spec is equal (heads and dtype too, which a
/// layout does not know); the hit is the same either way except beside a chunked-local group
/// whose chunk is not a multiple of the block, where a caller with such groups of one kind and
/// different specs must not use a layout (`kvtier.simple` refuses it).
///
/// ```
/// use kvtier_core::simple::{GroupKind, Layout};
/// let gemma = Layout::new(&[
///     GroupKind::FullAttention,
///     GroupKind::SlidingWindow { window: 1024 },
/// ])?;
/// assert_eq!(gemma.attention_group(), 0);
/// assert!(gemma.is_hybrid());
/// # Ok::<(), kvtier_core::simple::ConfigError>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Layout {
    kinds: [GroupKind; MAX_GROUPS],
    /// Per group: its block size in tokens, 0 for the scheduler's.
    block_sizes: [u32; MAX_GROUPS],
    /// vLLM's `is_eagle_group`, one bit per group.
    eagle: u8,
    len: u8,
}

impl Default for Layout {
    fn default() -> Self {
        Self::dense()
    }
}

impl Layout {
    /// One full-attention group: a dense model.
    #[must_use]
    pub const fn dense() -> Self {
        Layout {
            kinds: [GroupKind::Scratch; MAX_GROUPS],
            block_sizes: [0; MAX_GROUPS],
            eagle: 0,
            len: 1,
        }
        .with(0, GroupKind::FullAttention)
    }

    /// A full-attention group and a Mamba group: attention first (groups 0, 1) or second.
    #[must_use]
    pub const fn hybrid_mamba(attention_first: bool) -> Self {
        let (a, m) = if attention_first {
            (GroupKind::FullAttention, GroupKind::Mamba)
        } else {
            (GroupKind::Mamba, GroupKind::FullAttention)
        };
        Layout {
            kinds: [GroupKind::Scratch; MAX_GROUPS],
            block_sizes: [0; MAX_GROUPS],
            eagle: 0,
            len: 2,
        }
        .with(0, a)
        .with(1, m)
    }

    const fn with(mut self, i: usize, kind: GroupKind) -> Self {
        self.kinds[i] = kind;
        self
    }

    /// The layout of `kinds`, checked.
    ///
    /// # Errors
    /// [`ConfigError::Layout`] when `kinds` is empty or longer than [`MAX_GROUPS`], has no
    /// full-attention group, or a window or chunk of 0.
    pub fn new(kinds: &[GroupKind]) -> Result<Self, ConfigError> {
        if kinds.is_empty() || kinds.len() > MAX_GROUPS {
            return Err(ConfigError::Layout {
                why: "a layout has 1 to 8 groups",
            });
        }
        if !kinds.contains(&GroupKind::FullAttention) {
            return Err(ConfigError::Layout {
                why: "a layout needs a full-attention group",
            });
        }
        if kinds.iter().any(|k| {
            matches!(
                k,
                GroupKind::SlidingWindow { window: 0 } | GroupKind::ChunkedLocal { chunk: 0 }
            )
        }) {
            return Err(ConfigError::Layout {
                why: "a sliding window or attention chunk must be > 0 tokens",
            });
        }
        let mut l = Layout {
            kinds: [GroupKind::Scratch; MAX_GROUPS],
            block_sizes: [0; MAX_GROUPS],
            eagle: 0,
            len: u8::try_from(kinds.len()).unwrap_or(u8::MAX), // at most MAX_GROUPS
        };
        l.kinds[..kinds.len()].copy_from_slice(kinds);
        Ok(l)
    }

    /// The layout with group `group`'s block size set to `tokens` (vLLM's effective block
    /// size: the spec's, times the DCP world size for a DCP-sharded group). Groups left alone
    /// have the scheduler's block size. [`SimpleConfig::validate`](super::SimpleConfig::validate)
    /// checks the sizes against the scheduler's and the hash block size.
    ///
    /// ```
    /// use kvtier_core::simple::{Layout, SimpleConfig};
    /// // A 64-token attention block beside a 256-token Mamba block (the scheduler's), hashed
    /// // every 16 tokens: eager hits end on any 16-token boundary.
    /// let l = Layout::hybrid_mamba(true).with_block_size(0, 64)?;
    /// assert_eq!((l.block_size(0), l.block_size(1)), (Some(64), None));
    /// let mut c = SimpleConfig::with_cpu_blocks(256, 100, 10);
    /// c.layout = l;
    /// c.hash_block_size = Some(16);
    /// let v = c.validate()?;
    /// assert!(v.partial_hash_hits);
    /// assert_eq!(v.group_block_sizes[..2], [64, 256]);
    /// # Ok::<(), kvtier_core::simple::ConfigError>(())
    /// ```
    ///
    /// # Errors
    /// [`ConfigError::Layout`] when the layout has no group `group` or `tokens` is 0.
    pub fn with_block_size(mut self, group: u32, tokens: u32) -> Result<Self, ConfigError> {
        if group as usize >= self.len() {
            return Err(ConfigError::Layout {
                why: "a block size for a group the layout does not have",
            });
        }
        if tokens == 0 {
            return Err(ConfigError::Layout {
                why: "a group's block size must be > 0 tokens",
            });
        }
        self.block_sizes[group as usize] = tokens;
        Ok(self)
    }

    /// The layout with group `group` marked as an EAGLE draft group (vLLM's
    /// `KVCacheGroupSpec.is_eagle_group`): with
    /// [`SimpleConfig::use_eagle_block_drop`](super::SimpleConfig::use_eagle_block_drop), the
    /// marked groups' hits drop their last block (every group's when none is marked).
    ///
    /// # Errors
    /// [`ConfigError::Layout`] when the layout has no group `group`.
    pub fn with_eagle_group(mut self, group: u32) -> Result<Self, ConfigError> {
        if group as usize >= self.len() {
            return Err(ConfigError::Layout {
                why: "an EAGLE mark for a group the layout does not have",
            });
        }
        self.eagle |= 1 << group;
        Ok(self)
    }

    /// The groups marked as EAGLE draft groups, one bit per group.
    #[must_use]
    pub fn eagle_groups(&self) -> u8 {
        self.eagle
    }

    /// Group `group`'s own block size, `None` when it has the scheduler's (or the layout has
    /// no such group).
    #[must_use]
    pub fn block_size(&self, group: u32) -> Option<u32> {
        self.block_sizes
            .get(group as usize)
            .copied()
            .filter(|&b| b != 0 && (group as usize) < self.len())
    }

    /// The groups' kinds, in group order.
    #[must_use]
    pub fn kinds(&self) -> &[GroupKind] {
        &self.kinds[..usize::from(self.len)]
    }

    /// The number of groups.
    #[must_use]
    pub fn len(&self) -> usize {
        usize::from(self.len)
    }

    /// Never true for a valid layout (kept for the `len` convention).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The kind of group `group`, if the layout has it.
    #[must_use]
    pub fn kind(&self, group: u32) -> Option<GroupKind> {
        self.kinds().get(group as usize).copied()
    }

    /// The first full-attention group (vLLM's `fa_gidx`).
    #[must_use]
    pub fn attention_group(&self) -> u32 {
        let i = self
            .kinds()
            .iter()
            .position(|&k| k == GroupKind::FullAttention)
            .unwrap_or(0);
        super::len32(i)
    }

    /// The first Mamba group, if any.
    #[must_use]
    pub fn mamba_group(&self) -> Option<u32> {
        let i = self.kinds().iter().position(|&k| k == GroupKind::Mamba)?;
        Some(super::len32(i))
    }

    /// More than one group (vLLM's hybrid coordinator): no re-prefillable tail is held back.
    #[must_use]
    pub fn is_hybrid(&self) -> bool {
        self.len > 1
    }

    /// The prefix-cacheable groups, with their ids, in group order.
    pub fn cacheable(&self) -> impl Iterator<Item = (u32, GroupKind)> + '_ {
        self.kinds()
            .iter()
            .enumerate()
            .filter(|(_, k)| k.is_cacheable())
            .map(|(i, &k)| (super::len32(i), k))
    }
}

/// One of vLLM's spec groups: the prefix-cacheable groups of one kind and block size, looked
/// up together (a hit needs every member to hold the block).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpecGroup {
    pub(crate) kind: GroupKind,
    /// The members' block size in tokens.
    pub(crate) block: u32,
    /// The member groups, one bit per group id.
    pub(crate) members: u8,
    /// A member drops EAGLE's block (vLLM's `SpecGroup.use_eagle`).
    pub(crate) eagle: bool,
}

impl SpecGroup {
    /// The member group ids, in group order (`members` has one bit per group: 8 = MAX_GROUPS).
    pub(crate) fn groups(self) -> impl Iterator<Item = u32> {
        // The set bits, lowest first: one step per member (the lookup's hot path).
        let mut bits = self.members;
        core::iter::from_fn(move || {
            (bits != 0).then(|| {
                let g = bits.trailing_zeros();
                bits &= bits - 1;
                g
            })
        })
    }
}

/// A layout's spec groups in vLLM's lookup order (`verify_and_split_kv_cache_groups`): by
/// first member, full attention first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SpecGroups {
    groups: [SpecGroup; MAX_GROUPS],
    len: u8,
}

impl SpecGroups {
    /// The spec groups of `layout` with each group's block size in `blocks`, the groups in
    /// `drop` (one bit each) dropping EAGLE's block.
    pub(crate) fn of(layout: &Layout, blocks: &[u32; MAX_GROUPS], drop: u8) -> Self {
        let mut out = SpecGroups {
            groups: [SpecGroup {
                kind: GroupKind::Scratch,
                block: 0,
                members: 0,
                eagle: false,
            }; MAX_GROUPS],
            len: 0,
        };
        let fa = |k: GroupKind| k == GroupKind::FullAttention;
        for pass_fa in [true, false] {
            for (g, kind) in layout.cacheable().filter(|&(_, k)| fa(k) == pass_fa) {
                let block = blocks[g as usize];
                let eagle = drop & (1 << g) != 0;
                let n = usize::from(out.len);
                match out.groups[..n]
                    .iter_mut()
                    .find(|s| s.kind == kind && s.block == block)
                {
                    Some(s) => {
                        s.members |= 1 << g;
                        s.eagle |= eagle;
                    }
                    None => {
                        out.groups[n] = SpecGroup {
                            kind,
                            block,
                            members: 1 << g,
                            eagle,
                        };
                        out.len += 1;
                    }
                }
            }
        }
        out
    }

    /// The spec groups, in lookup order.
    pub(crate) fn as_slice(&self) -> &[SpecGroup] {
        &self.groups[..usize::from(self.len)]
    }

    /// Whether group `g`'s manager drops EAGLE's block (its spec group's flag).
    pub(crate) fn eagle(&self, g: u32) -> bool {
        self.as_slice()
            .iter()
            .any(|s| s.members & (1 << g) != 0 && s.eagle)
    }
}
