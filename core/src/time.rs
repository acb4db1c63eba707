//! Time as values passed in by the caller.
//!
//! The core never reads a clock. Anything time-dependent (transfer durations, lookup delays) is
//! given to it as a [`Tick`], a count of nanoseconds from a zero the caller chooses, or as a
//! [`TickDelta`]. The std adapter owns the only `std::time::Instant` and converts it.

use core::fmt;

/// A point in time: nanoseconds since an epoch chosen by the caller.
///
/// Producers must hand out monotonically non-decreasing values; the core never assumes more.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tick(pub u64);

/// A span of time in nanoseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TickDelta(pub u64);

impl Tick {
    /// The epoch.
    pub const ZERO: Tick = Tick(0);

    /// Nanoseconds since the epoch.
    #[must_use]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + d`, or `None` on overflow.
    #[must_use]
    pub const fn checked_add(self, d: TickDelta) -> Option<Tick> {
        match self.0.checked_add(d.0) {
            Some(v) => Some(Tick(v)),
            None => None,
        }
    }

    /// The time elapsed from `earlier` to `self`, or `None` if `earlier` is later than `self`.
    #[must_use]
    pub const fn checked_since(self, earlier: Tick) -> Option<TickDelta> {
        match self.0.checked_sub(earlier.0) {
            Some(v) => Some(TickDelta(v)),
            None => None,
        }
    }

    /// The time elapsed from `earlier` to `self`, or zero if `earlier` is later.
    #[must_use]
    pub const fn saturating_since(self, earlier: Tick) -> TickDelta {
        TickDelta(self.0.saturating_sub(earlier.0))
    }
}

impl TickDelta {
    /// No time.
    pub const ZERO: TickDelta = TickDelta(0);

    /// A delta of `ms` milliseconds, or `None` on overflow.
    #[must_use]
    pub const fn checked_from_millis(ms: u64) -> Option<TickDelta> {
        match ms.checked_mul(1_000_000) {
            Some(v) => Some(TickDelta(v)),
            None => None,
        }
    }

    /// Nanoseconds in this delta.
    #[must_use]
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// `self + other`, saturating at `u64::MAX` nanoseconds.
    #[must_use]
    pub const fn saturating_add(self, other: TickDelta) -> TickDelta {
        TickDelta(self.0.saturating_add(other.0))
    }
}

impl fmt::Display for Tick {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

impl fmt::Display for TickDelta {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ns", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arithmetic_is_checked() {
        assert_eq!(Tick(5).checked_add(TickDelta(3)), Some(Tick(8)));
        assert_eq!(Tick(u64::MAX).checked_add(TickDelta(1)), None);
        assert_eq!(Tick(8).checked_since(Tick(5)), Some(TickDelta(3)));
        assert_eq!(Tick(5).checked_since(Tick(8)), None);
        assert_eq!(Tick(5).saturating_since(Tick(8)), TickDelta(0));
        assert_eq!(
            TickDelta::checked_from_millis(2),
            Some(TickDelta(2_000_000))
        );
        assert_eq!(TickDelta::checked_from_millis(u64::MAX), None);
        assert_eq!(
            TickDelta(u64::MAX).saturating_add(TickDelta(1)),
            TickDelta(u64::MAX)
        );
    }
}
