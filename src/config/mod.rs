//! Reading the configuration files admins already have for container tools.

pub mod registries;
