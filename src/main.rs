// unsafe: process-level setup that only libc offers.
#![allow(unsafe_code)]
use std::process::ExitCode;

use clap::Parser;
use pivot::cli::{self, Cli, Exit};
use pivot::progress::Progress;

fn main() -> ExitCode {
    // glibc gives each thread that allocates its own arena (up to 8 per core), and each keeps
    // freed chunks: with the download, decompression and write threads of two layers that
    // would multiply the peak RSS. Two arenas keep it bounded at no measurable cost.
    // SAFETY: called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    let cli = Cli::parse();
    // Claimed before anything else opens a descriptor that could take its number.
    let progress = match Progress::new(cli.pivot.progress_fd) {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e:#}");
            return ExitCode::from(Exit::Failure as u8);
        }
    };
    pivot::logging::init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("starting the async runtime: {e}");
            return ExitCode::from(Exit::Failure as u8);
        }
    };
    match runtime.block_on(cli::run(cli, progress)) {
        Ok(exit) => ExitCode::from(exit as u8),
        Err(e) => {
            // A failed pivot was already logged as a journal event, with its fields.
            if e.downcast_ref::<pivot::events::Reported>().is_none() {
                tracing::error!("{e:#}");
            }
            ExitCode::from(Exit::Failure as u8)
        }
    }
}
