//! Control plane of space: the public HTTP API, tenants and API keys, audit, state.
