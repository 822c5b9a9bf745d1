//! Envoy's rate limit service: its configuration files and descriptor matching.
