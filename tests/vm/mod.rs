//! The VM harness: real bootable OSTree disk images of a small Debian 12, booted under QEMU
//! through their own bootloader. See tests/vm.rs for the scenarios.

pub mod agent;
pub mod apt_source;
pub mod base_os;
pub mod cache;
pub mod checks;
pub mod cmd;
pub mod disk;
pub mod facts;
pub mod firmware;
pub mod images;
pub mod machine;
pub mod mounts;
pub mod os_commits;
pub mod oscontainer;
pub mod qemu;
pub mod saved_disk;
pub mod scenario;
