//! [`Payload::aggregate`]: folding one payload into another, checked whole before anything
//! changes.

use alloc::vec::Vec;

use super::{AggregateError, MAX_SERIES, Payload, Value};
use crate::stats::catalogue::MetricKind;

impl Payload {
    /// Folds `other` into `self`: counters sum (saturating), gauges take `other`'s value,
    /// histograms merge bucket by bucket, and `other`'s info, when it has one, replaces `self`'s
    /// (a payload without info never clears it). An empty `other` changes nothing.
    ///
    /// # Errors
    /// [`AggregateError`] when a name has different kinds, a histogram has different bounds, or
    /// the union would pass [`MAX_SERIES`]. Everything is checked before anything changes, so
    /// `self` is unchanged on error.
    pub fn aggregate(&mut self, other: &Payload) -> Result<(), AggregateError> {
        let added = self.check_aggregate(other)?;
        if let Some(info) = &other.info {
            self.info = Some(info.clone());
        }
        if added == 0 {
            // Every series exists: update in place, walking both sorted lists together.
            let mut i = 0;
            for o in &other.series {
                while self.series.get(i).is_some_and(|s| s.key_cmp(o).is_lt()) {
                    i += 1;
                }
                if let Some(s) = self.series.get_mut(i) {
                    combine(&mut s.value, &o.value);
                }
            }
            return Ok(());
        }
        let mut merged = Vec::with_capacity(self.series.len() + added);
        let mut mine = core::mem::take(&mut self.series).into_iter().peekable();
        for o in &other.series {
            while let Some(s) = mine.next_if(|s| s.key_cmp(o).is_lt()) {
                merged.push(s);
            }
            match mine.next_if(|s| s.key_cmp(o).is_eq()) {
                Some(mut s) => {
                    combine(&mut s.value, &o.value);
                    merged.push(s);
                }
                None => merged.push(o.clone()),
            }
        }
        merged.extend(mine);
        self.series = merged;
        Ok(())
    }

    /// Checks `aggregate` and returns how many series it would add.
    fn check_aggregate(&self, other: &Payload) -> Result<usize, AggregateError> {
        let mut added = 0usize;
        let mut i = 0;
        let mut last_kind: Option<(&str, MetricKind)> = None;
        for o in &other.series {
            while self.series.get(i).is_some_and(|s| s.key_cmp(o).is_lt()) {
                if let Some(s) = self.series.get(i) {
                    last_kind = Some((&s.name, s.kind()));
                }
                i += 1;
            }
            let same = self.series.get(i).filter(|s| s.key_cmp(o).is_eq());
            let family = same
                .or_else(|| self.series.get(i).filter(|s| s.name == o.name))
                .map(|s| s.kind())
                .or_else(|| last_kind.filter(|(n, _)| *n == o.name).map(|(_, k)| k));
            if let Some(existing) = family.filter(|k| *k != o.kind()) {
                return Err(AggregateError::KindConflict {
                    name: o.name.clone(),
                    existing,
                    other: o.kind(),
                });
            }
            match (same.map(|s| &s.value), &o.value) {
                (Some(Value::Histogram(a)), Value::Histogram(b)) if a.bounds() != b.bounds() => {
                    return Err(AggregateError::BoundsMismatch {
                        name: o.name.clone(),
                    });
                }
                (None, _) => added += 1,
                _ => {}
            }
        }
        if self.series.len().saturating_add(added) > MAX_SERIES {
            return Err(AggregateError::TooManySeries);
        }
        Ok(added)
    }
}

/// Folds `other` into `mine` (same kind and bounds, checked before).
fn combine(mine: &mut Value, other: &Value) {
    match (mine, other) {
        (Value::Counter(a), Value::Counter(b)) => *a = a.saturating_add(*b),
        (Value::Gauge(a), Value::Gauge(b)) => *a = *b,
        (Value::Histogram(a), Value::Histogram(b)) => {
            // Bounds were checked by `check_aggregate`; a mismatch cannot happen here.
            let _ = a.merge(b);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Gauge;
    use crate::stats::catalogue::*;
    use crate::stats::histogram::Histogram;

    #[test]
    fn aggregate_merges_sorted_and_checks_first() {
        let mut a = Payload::new();
        a.increase_counter(LOAD_BYTES, &[], 100).unwrap();
        a.observe(LOAD_SIZE, &[], 100).unwrap();
        let mut b = Payload::new();
        b.increase_counter(ALLOCATION_FAILURE, &[], 1).unwrap();
        b.increase_counter(LOAD_BYTES, &[], 50).unwrap();
        b.observe(LOAD_SIZE, &[], 50).unwrap();
        b.increase_counter(STORES_SKIPPED, &[], 0).unwrap();
        a.aggregate(&b).unwrap();
        assert_eq!(a.len(), 4);
        assert_eq!(a.counter(LOAD_BYTES, &[]), Some(150));
        assert_eq!(a.histogram(LOAD_SIZE, &[]).unwrap().sum(), 150);
        assert!(a.series().windows(2).all(|w| w[0].key_cmp(&w[1]).is_lt()));

        let mut c = Payload::new();
        c.increase_counter(ALLOCATION_FAILURE, &[], 5).unwrap();
        c.set_gauge(LOAD_BYTES, &["x"], Gauge::ZERO).unwrap();
        let before = a.clone();
        assert!(matches!(
            a.aggregate(&c),
            Err(AggregateError::KindConflict {
                existing: MetricKind::Counter,
                ..
            })
        ));
        assert_eq!(a, before);
        let mut d = Payload::new();
        d.merge_histogram(LOAD_SIZE, &[], &Histogram::new(&[1]).unwrap())
            .unwrap();
        assert!(matches!(
            a.aggregate(&d),
            Err(AggregateError::BoundsMismatch { .. })
        ));
        assert_eq!(a, before);
    }
}
