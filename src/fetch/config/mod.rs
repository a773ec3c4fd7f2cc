//! Reading the configuration files admins already have for container tools.

pub mod auth;
pub mod certs;
pub mod registries;
