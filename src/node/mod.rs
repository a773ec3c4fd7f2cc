//! What the node records and tells: pivot's [`state`] file, [`status`], the next-boot
//! [`confirm`]ation, journal [`events`] and [`logging`], [`progress`] for whoever waits, and the
//! [`reboot`].

pub mod confirm;
pub mod events;
pub mod logging;
pub mod progress;
pub mod reboot;
pub mod state;
pub mod status;
