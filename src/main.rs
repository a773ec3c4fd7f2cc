// unsafe: process-level setup that only libc offers.
#![allow(unsafe_code)]
use std::process::ExitCode;

fn main() -> ExitCode {
    // glibc gives each thread that allocates its own arena (up to 8 per core), and each keeps
    // freed chunks: with the download, decompression and write threads of two layers that
    // would multiply the peak RSS. Two arenas keep it bounded at no measurable cost.
    // SAFETY: called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
    pivot::cli::main()
}
