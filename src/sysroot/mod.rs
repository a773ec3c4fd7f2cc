//! The sysroot: its [`deployments`] as plain data, [`kargs`] of the new deployment and those
//! the image ships ([`kargs_d`]), the [`packages`] a commit carries; free [`space`] checked before anything big is written, the deployment itself ([`deploy`]) and
//! the [`prune`] after it; a [`rollback`] to the deployment before; [`finalize`] for a locked
//! staged one; [`grubenv`], GRUB's boot-once attempt at a new deployment; the mount
//! [`namespace`] where a read-only `/sysroot` and `/boot` are written.

pub(crate) mod commit_files;
pub mod deploy;
pub mod deployments;
pub mod finalize;
pub mod grubenv;
pub mod kargs;
pub mod kargs_d;
pub mod namespace;
pub mod packages;
pub mod prune;
pub mod rollback;
pub mod space;
