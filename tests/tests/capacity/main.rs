//! Capacity arithmetic and `kvtier capacity`: hand-computed cases for every layer kind, the
//! property tests, and the command's report as a library.

mod capacity;
mod capacity_cli;
mod capacity_props;
