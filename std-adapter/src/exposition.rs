//! Prometheus text exposition of a stats payload under the names a vLLM server exposes.
