//! What the node records and tells: pivot's [`state`] file, [`status`], the package [`diff`]
//! between deployments, the next-boot [`confirm`]ation and the [`health`] checks run with it,
//! journal [`events`] and [`logging`] (a bug's too: [`panics`]), [`progress`] for whoever waits,
//! and the [`reboot`].

pub mod confirm;
pub mod diff;
pub mod drop_ins;
pub mod events;
pub mod health;
pub mod logging;
pub mod panics;
pub mod progress;
pub mod reboot;
pub mod state;
pub mod status;
