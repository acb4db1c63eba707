//! kvtrace v1: the streaming reader and the built-in generator.
