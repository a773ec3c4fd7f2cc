// unsafe: process-level setup that only libc offers.
#![allow(unsafe_code)]
use std::process::ExitCode;

fn main() -> ExitCode {
    // glibc gives each thread that allocates its own arena (up to 8 per core), and each keeps
    // freed chunks: with the download, decompression and write threads of two layers that
    // would multiply the peak RSS. Two arenas keep it bounded at no measurable cost.
    // glibc also raises its mmap threshold to the size of each mapped block freed, after which
    // the layer's object buffers (up to 1 MiB each, freed on another thread than the one that
    // allocated them) fragment the heap instead: a 1 GB single-layer pivot grew from 43 to 50
    // MiB. A fixed threshold keeps large buffers mapped and returned at free.
    // SAFETY: called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 2);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 << 10);
    }
    pivot::cli::main()
}
