//! Hybrid grouping: layers into KV-cache groups, as vLLM 0.33.0's `get_kv_cache_groups` does
//! on its page-unification path.
//!
//! 1. No layers: no group (attention-free).
//! 2. Every layer has the same spec: one group.
//! 3. Every layer has the same *type* (same block size, same kind and window/chunk; Full and MLA
//!    count as one type): one "uniform type" group, whose layers may differ in shape.
//! 4. Otherwise pages are unified to the largest page — by scaling a smaller layer's block size
//!    by the integer ratio when it divides the largest page, by padding Mamba layers and
//!    non-divisible non-MLA attention layers — then layers are bucketed by spec in order of
//!    first appearance. The group size is the smallest bucket's layer count, or the largest when
//!    `max < 1.5 · min`; each bucket of `n` layers becomes `cdiv(n, group_size)` groups by
//!    strided assignment (`layers[i::num_groups]`).
//!
//! Not reproduced: vLLM's block-outermost *packed* grouping of mixed page sizes
//! (`_get_packed_kv_cache_groups`), the MLA + sliding-window full-allocation fallback, HiSparse
//! and hidden-state layers.

use alloc::vec::Vec;
use core::ops::Range;

use super::error::{GroupingError, PromotionError, SizingError};
use super::spec::{LayerKind, LayerSpec, Workload};

/// The most layers a layout may have.
pub const MAX_LAYERS: usize = 1 << 16;

/// One KV-cache group: the layers that share one block table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvGroup {
    /// Indices (into [`GroupedLayout::layers`]) of the layers in the group on this worker.
    layers: Vec<u32>,
    /// Indices of the layers whose specs define the group's per-request size. Equal to
    /// `layers` unless a pipeline projection left this worker none of them (vLLM keeps the
    /// group's spec then).
    spec_layers: Vec<u32>,
}

impl KvGroup {
    /// Indices of the layers in this group.
    #[must_use]
    pub fn layers(&self) -> &[u32] {
        &self.layers
    }
}

/// Layers with validated specs, partitioned into KV-cache groups.
///
/// ```
/// use kvtier_core::capacity::{GroupedLayout, LayerKind, LayerSpec};
/// let full = LayerSpec::attention(LayerKind::Full, 16, 8, 128, 2);
/// let swa = LayerSpec::attention(LayerKind::SlidingWindow { window: 4096, extra_retained_tokens: 0 }, 16, 8, 128, 2);
/// // Gemma-2-like: alternating sliding / full, 4 layers → 2 buckets of 2 → 2 groups.
/// let layout = GroupedLayout::from_layers(&[swa, full, swa, full])?;
/// assert_eq!(layout.num_groups(), 2);
/// # Ok::<(), kvtier_core::capacity::GroupingError>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupedLayout {
    layers: Vec<LayerSpec>,
    pages: Vec<u64>,
    groups: Vec<KvGroup>,
}

fn checked_index(i: usize) -> Result<u32, GroupingError> {
    u32::try_from(i).map_err(|_| GroupingError::TooManyLayers)
}

fn validate_all(layers: &[LayerSpec]) -> Result<Vec<u64>, GroupingError> {
    if layers.len() > MAX_LAYERS {
        return Err(GroupingError::TooManyLayers);
    }
    layers
        .iter()
        .enumerate()
        .map(|(layer, s)| {
            s.validate()
                .and_then(|()| s.page_bytes())
                .map_err(|error| GroupingError::Spec { layer, error })
        })
        .collect()
}

/// Unifies every page to the largest one (vLLM's `unify_kv_cache_spec_page_size`).
fn unify_pages(layers: &mut [LayerSpec], pages: &mut [u64]) -> Result<(), GroupingError> {
    let Some(&max_page) = pages.iter().max() else {
        return Ok(());
    };
    for (layer, (spec, page)) in layers.iter_mut().zip(pages.iter_mut()).enumerate() {
        if *page == max_page {
            continue;
        }
        let mut new = *spec;
        if matches!(spec.kind, LayerKind::Mamba { .. }) {
            new.page_size_padded = Some(max_page);
        } else if max_page % *page == 0 {
            if spec.page_size_padded.is_some() {
                // Scaling the block keeps the old padded page: vLLM's assertion fails here.
                return Err(GroupingError::NotUnifiable { layer });
            }
            new.block_size = spec
                .block_size
                .checked_mul(max_page / *page)
                .ok_or(GroupingError::Overflow)?;
        } else if !matches!(spec.kind, LayerKind::Mla) {
            new.page_size_padded = Some(max_page);
        } else {
            return Err(GroupingError::NotUnifiable { layer });
        }
        let new_page = new
            .page_bytes()
            .map_err(|error| GroupingError::Spec { layer, error })?;
        if new_page != max_page {
            return Err(GroupingError::NotUnifiable { layer });
        }
        *spec = new;
        *page = new_page;
    }
    Ok(())
}

/// Allocates local-attention layers as full attention, as vLLM 0.33.0 does with its hybrid
/// KV-cache manager disabled (`--disable-hybrid-kv-cache-manager`; its
/// `_promote_local_kv_cache_specs`). Layers all of one type are left as they are. Otherwise,
/// when full-attention (or MLA) layers are present, every sliding-window and chunked-local
/// layer becomes full attention, takes the full layers' block size when they share one, and
/// keeps a padded page at least as large as its page at that block size. The layers must then
/// be of one type.
///
/// ```
/// use kvtier_core::capacity::{promote_local_layers, GroupedLayout, LayerKind, LayerSpec};
/// let full = LayerSpec::attention(LayerKind::Full, 16, 8, 128, 2);
/// let swa = LayerSpec::attention(LayerKind::SlidingWindow { window: 4096, extra_retained_tokens: 0 }, 16, 8, 128, 2);
/// let mut layers = [swa, full, swa, full];
/// promote_local_layers(&mut layers)?;
/// assert!(layers.iter().all(|l| l.kind == LayerKind::Full));
/// assert_eq!(GroupedLayout::from_layers(&layers)?.num_groups(), 1);
/// # Ok::<(), Box<dyn core::error::Error>>(())
/// ```
///
/// # Errors
/// [`PromotionError`]: a Mamba layer, layers still of several types, or overflow. On error the
/// layers are unchanged.
pub fn promote_local_layers(layers: &mut [LayerSpec]) -> Result<(), PromotionError> {
    if let Some(layer) = layers
        .iter()
        .position(|l| matches!(l.kind, LayerKind::Mamba { .. }))
    {
        return Err(PromotionError::StateLayer { layer });
    }
    let Some(first) = layers.first().copied() else {
        return Ok(());
    };
    if layers.iter().all(|l| l.same_type_as(&first)) {
        return Ok(());
    }
    let is_full = |l: &LayerSpec| matches!(l.kind, LayerKind::Full | LayerKind::Mla);
    let is_local = |l: &LayerSpec| {
        matches!(
            l.kind,
            LayerKind::SlidingWindow { .. } | LayerKind::ChunkedLocal { .. }
        )
    };
    let mut promoted = layers.to_vec();
    if layers.iter().any(is_full) && layers.iter().any(is_local) {
        let mut full_blocks = layers.iter().filter(|l| is_full(l)).map(|l| l.block_size);
        let one_block = full_blocks.next().filter(|&b| full_blocks.all(|x| x == b));
        for spec in promoted.iter_mut().filter(|l| is_local(l)) {
            let block = one_block.unwrap_or(spec.block_size);
            if let Some(padded) = spec.page_size_padded {
                let unpadded = spec
                    .unpadded_page_bytes()
                    .ok()
                    .and_then(|p| p.checked_mul(block))
                    .and_then(|p| p.checked_div(spec.block_size))
                    .ok_or(PromotionError::Overflow)?;
                spec.page_size_padded = Some(padded.max(unpadded));
            }
            spec.block_size = block;
            spec.kind = LayerKind::Full;
        }
    }
    let head = promoted.first().copied().unwrap_or(first);
    if !promoted.iter().all(|l| l.same_type_as(&head)) {
        return Err(PromotionError::NotOneType);
    }
    layers.copy_from_slice(&promoted);
    Ok(())
}

impl GroupedLayout {
    /// Groups `layers` (one entry per layer, in model order) as vLLM does; see the module docs.
    ///
    /// # Errors
    /// [`GroupingError`] on an invalid spec, too many layers, or pages that cannot be unified.
    pub fn from_layers(layers: &[LayerSpec]) -> Result<Self, GroupingError> {
        let mut pages = validate_all(layers)?;
        let mut layers = layers.to_vec();
        let Some(first) = layers.first().copied() else {
            return Ok(Self {
                layers,
                pages,
                groups: Vec::new(),
            });
        };
        let all: Vec<u32> = (0..layers.len())
            .map(checked_index)
            .collect::<Result<_, _>>()?;
        if layers.iter().all(|s| *s == first) || layers.iter().all(|s| s.same_type_as(&first)) {
            let groups = alloc::vec![KvGroup {
                spec_layers: all.clone(),
                layers: all
            }];
            return Ok(Self {
                layers,
                pages,
                groups,
            });
        }
        unify_pages(&mut layers, &mut pages)?;
        // Buckets of identical specs, in order of first appearance.
        let mut buckets: Vec<(LayerSpec, Vec<u32>)> = Vec::new();
        for (i, spec) in layers.iter().enumerate() {
            let idx = checked_index(i)?;
            match buckets.iter_mut().find(|(s, _)| s == spec) {
                Some((_, members)) => members.push(idx),
                None => buckets.push((*spec, alloc::vec![idx])),
            }
        }
        let min = buckets.iter().map(|(_, m)| m.len()).min().unwrap_or(1);
        let max = buckets.iter().map(|(_, m)| m.len()).max().unwrap_or(1);
        // `max < 1.5 · min` ⇔ `2 · max < 3 · min` (lengths ≤ MAX_LAYERS, no overflow).
        let group_size = if 2 * max < 3 * min { max } else { min };
        let mut groups = Vec::new();
        for (_, members) in &buckets {
            let n = members.len();
            let num_groups = n.div_ceil(group_size.max(1));
            for i in 0..num_groups {
                let g: Vec<u32> = members
                    .iter()
                    .skip(i)
                    .step_by(num_groups)
                    .copied()
                    .collect();
                groups.push(KvGroup {
                    spec_layers: g.clone(),
                    layers: g,
                });
            }
        }
        Ok(Self {
            layers,
            pages,
            groups,
        })
    }

    /// Explicit groups, each a list of layer specs (the layout file's `groups`). Layers of one
    /// group may differ in shape (a uniform-type group).
    ///
    /// # Errors
    /// [`GroupingError`] on an invalid spec, an empty group or too many layers.
    pub fn from_groups(groups: &[Vec<LayerSpec>]) -> Result<Self, GroupingError> {
        let total = groups
            .iter()
            .try_fold(0usize, |acc, g| acc.checked_add(g.len()));
        if total.is_none_or(|t| t > MAX_LAYERS) {
            return Err(GroupingError::TooManyLayers);
        }
        let layers: Vec<LayerSpec> = groups.iter().flatten().copied().collect();
        let pages = validate_all(&layers)?;
        let mut out = Vec::with_capacity(groups.len());
        let mut next = 0usize;
        for (group, g) in groups.iter().enumerate() {
            if g.is_empty() {
                return Err(GroupingError::EmptyGroup { group });
            }
            let ids: Vec<u32> = (next..next + g.len())
                .map(checked_index)
                .collect::<Result<_, _>>()?;
            next += g.len();
            out.push(KvGroup {
                spec_layers: ids.clone(),
                layers: ids,
            });
        }
        Ok(Self {
            layers,
            pages,
            groups: out,
        })
    }

    /// The layer specs after page unification, in model order.
    #[must_use]
    pub fn layers(&self) -> &[LayerSpec] {
        &self.layers
    }

    /// The groups.
    #[must_use]
    pub fn groups(&self) -> &[KvGroup] {
        &self.groups
    }

    /// Number of groups (0 for an attention-free model).
    #[must_use]
    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// Page bytes of layer `i` (validated), or `None` when out of range.
    #[must_use]
    pub fn page_bytes(&self, i: u32) -> Option<u64> {
        self.pages.get(usize::try_from(i).ok()?).copied()
    }

    fn spec(&self, i: u32) -> Option<&LayerSpec> {
        self.layers.get(usize::try_from(i).ok()?)
    }

    /// The spec that stands for group `g` (its first spec layer), or `None` when out of range.
    #[must_use]
    pub fn group_spec(&self, g: usize) -> Option<&LayerSpec> {
        let group = self.groups.get(g)?;
        self.spec(*group.spec_layers.first()?)
    }

    /// Σ of the pages of group `g`'s layers on this worker (bytes of one block of the group).
    ///
    /// # Errors
    /// [`SizingError::Overflow`].
    pub fn group_page_bytes(&self, g: usize) -> Result<u64, SizingError> {
        let Some(group) = self.groups.get(g) else {
            return Ok(0);
        };
        group.layers.iter().try_fold(0u64, |acc, &i| {
            acc.checked_add(self.page_bytes(i).unwrap_or(0))
                .ok_or(SizingError::Overflow)
        })
    }

    /// Blocks one request needs in group `g`: the maximum over its layers of
    /// [`LayerSpec::blocks_per_request_ceil`] (vLLM's `max_memory_usage_pages` for a
    /// uniform-type group); 0 for an out-of-range group.
    ///
    /// # Errors
    /// As [`LayerSpec::blocks_per_request_ceil`].
    pub fn group_blocks_per_request(&self, g: usize, w: &Workload) -> Result<u64, SizingError> {
        let Some(group) = self.groups.get(g) else {
            return Ok(0);
        };
        let mut best = 0u64;
        let mut seen: Option<&LayerSpec> = None;
        for &i in &group.spec_layers {
            let Some(spec) = self.spec(i) else { continue };
            if seen == Some(spec) {
                continue;
            }
            seen = Some(spec);
            best = best.max(spec.blocks_per_request_ceil(w)?);
        }
        Ok(best)
    }

    /// Blocks one request of `w.max_model_len` tokens needs across all groups:
    /// `Σ_g group_blocks_per_request(g)`.
    ///
    /// # Errors
    /// As [`LayerSpec::blocks_per_request_ceil`], or overflow.
    pub fn blocks_per_request(&self, w: &Workload) -> Result<u64, SizingError> {
        (0..self.groups.len()).try_fold(0u64, |acc, g| {
            acc.checked_add(self.group_blocks_per_request(g, w)?)
                .ok_or(SizingError::Overflow)
        })
    }

    /// The layout one pipeline worker sees when it holds layers `range` (clamped): every group is
    /// kept, with only the worker's layers; a group left with none keeps its spec (as vLLM's
    /// `_project_kv_cache_groups_to_worker`).
    #[must_use]
    pub fn project(&self, range: Range<usize>) -> Self {
        let inside = |i: &u32| usize::try_from(*i).is_ok_and(|i| range.contains(&i));
        let groups = self
            .groups
            .iter()
            .map(|g| {
                let layers: Vec<u32> = g.layers.iter().copied().filter(inside).collect();
                let spec_layers = if layers.is_empty() {
                    g.spec_layers.clone()
                } else {
                    layers.clone()
                };
                KvGroup {
                    layers,
                    spec_layers,
                }
            })
            .collect();
        Self {
            layers: self.layers.clone(),
            pages: self.pages.clone(),
            groups,
        }
    }

    /// Splits the model's layers into `pp` pipeline stages (vLLM's default `get_pp_indices`:
    /// `n / pp` layers each, the remainder given one by one to the stages before the last,
    /// from the second-to-last backwards) and projects the layout on each.
    ///
    /// # Errors
    /// [`SizingError::Overflow`] when `pp = 0`.
    pub fn split_pipeline(&self, pp: usize) -> Result<Vec<Self>, SizingError> {
        if pp == 0 {
            return Err(SizingError::Overflow);
        }
        let n = self.layers.len();
        let mut sizes = alloc::vec![n / pp; pp];
        let rem = n % pp;
        for k in 0..rem {
            // Stage pp-2-k, wrapping to the last stage when pp is small.
            let idx = pp.checked_sub(2 + k).map_or(pp - 1, |i| i);
            if let Some(s) = sizes.get_mut(idx) {
                *s += 1;
            }
        }
        let mut start = 0usize;
        let mut out = Vec::with_capacity(pp);
        for s in sizes {
            out.push(self.project(start..start + s));
            start += s;
        }
        Ok(out)
    }

    /// `spec` as a layer kind name, for reports.
    #[must_use]
    pub fn group_kind(&self, g: usize) -> Option<&'static str> {
        self.group_spec(g).map(|s| s.kind.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attn(kind: LayerKind, block: u64) -> LayerSpec {
        LayerSpec::attention(kind, block, 2, 64, 2)
    }

    const SWA: LayerKind = LayerKind::SlidingWindow {
        window: 128,
        extra_retained_tokens: 3,
    };
    const CHUNK: LayerKind = LayerKind::ChunkedLocal { chunk: 256 };

    #[test]
    fn promotion_to_full_attention() {
        // One type already: unchanged (sliding-only stays sliding).
        let mut only = [attn(SWA, 16); 3];
        assert_eq!(promote_local_layers(&mut only), Ok(()));
        assert_eq!(only, [attn(SWA, 16); 3]);
        // Full + local: locals become full with the full block size; a padded page grows to
        // the page at that block size.
        let mut padded = attn(CHUNK, 16);
        padded.page_size_padded = Some(5000);
        let mut layers = [attn(LayerKind::Full, 32), attn(SWA, 16), padded];
        assert_eq!(promote_local_layers(&mut layers), Ok(()));
        assert!(
            layers
                .iter()
                .all(|l| l.kind == LayerKind::Full && l.block_size == 32)
        );
        // unpadded 2 · 16 · 128 · 2 = 8192 at block 16 → 16 384 at block 32 > 5000.
        assert_eq!(layers[2].page_size_padded, Some(16_384));
        assert_eq!(layers[1].page_size_padded, None);
        // MLA counts as full.
        let mla = LayerSpec::attention(LayerKind::Mla, 16, 1, 576, 2);
        let mut layers = [mla, attn(SWA, 16)];
        assert_eq!(promote_local_layers(&mut layers), Ok(()));
        assert_eq!(layers[1].kind, LayerKind::Full);
    }

    #[test]
    fn promotion_errors_change_nothing() {
        let before = [attn(SWA, 16), attn(CHUNK, 16)];
        let mut layers = before;
        assert_eq!(
            promote_local_layers(&mut layers),
            Err(PromotionError::NotOneType)
        );
        assert_eq!(layers, before);
        let before = [attn(LayerKind::Full, 16), LayerSpec::mamba(16, 4096)];
        let mut layers = before;
        assert_eq!(
            promote_local_layers(&mut layers),
            Err(PromotionError::StateLayer { layer: 1 })
        );
        assert_eq!(layers, before);
    }
}
