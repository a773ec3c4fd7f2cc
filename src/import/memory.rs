//! Keeping pivot's peak memory where the benchmark measures it (docs/benchmark.md).
//!
//! glibc keeps what a thread frees in that thread's arena for its next allocations; the
//! layer threads free their decompression and tar buffers as each layer ends, but a later
//! allocation on another thread (the store's largest: an object set, a few MiB at 1 GB; the
//! prune's reachable set) cannot reuse them and adds to the process's resident memory. Handing
//! the freed pages back first keeps those phases under the import's own peak.
// unsafe: malloc_trim.
#![allow(unsafe_code)]

/// Returns the pages the allocator holds free (all arenas) to the system.
pub fn release_freed() {
    // SAFETY: malloc_trim only releases memory no allocation holds; it is thread-safe.
    unsafe {
        libc::malloc_trim(0);
    }
}
