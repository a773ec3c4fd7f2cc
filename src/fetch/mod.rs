//! Fetching an image: the pullspec ([`reference`](mod@reference)), where it comes from
//! ([`source`]: a [`registry`] as the admins' [`config`] says, or an OCI [`layout`]), its
//! manifest and config ([`image`]), and layer bytes that [`blob_reader`] verifies as they
//! arrive, resuming after faults ([`retry`], [`content_range`]) and keeping them for a killed run's successor
//! ([`spools`], hashed on with [`sha256_state`]), through the environment's [`proxy`].

pub mod blob_reader;
pub mod config;
pub mod content_range;
pub mod image;
pub mod layout;
pub mod proxy;
pub mod reference;
pub mod registry;
pub mod retry;
pub mod retry_after;
pub mod sha256_state;
pub mod source;
pub(crate) mod spool_writer;
pub(crate) mod spools;
