//! Placeholder; replaced by the FreeQueue implementation.
