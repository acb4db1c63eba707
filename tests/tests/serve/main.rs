//! `kvtier serve` and what it serves: the `/metrics` endpoint (under hostile clients too),
//! vLLM's Grafana dashboard against a real Prometheus, and the KV-events stream.

mod dashboard;
mod http_hostile;
mod kv_events;
mod kv_events_simple;
mod serve;
mod serve_simple;
