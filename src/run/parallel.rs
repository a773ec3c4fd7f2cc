//! The layers of a [`Job`], imported [`PARALLEL_LAYERS`] at a time, largest first.

use std::collections::hash_map::{Entry, HashMap};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use anyhow::Result;

use super::job::Job;
use crate::fetch::image::Layer;
use crate::fetch::spools::Spools;
use crate::import::{self, RepoImporter, PARALLEL_LAYERS};

impl Job {
    /// Imports the layers [`PARALLEL_LAYERS`] at a time into the open transaction, each into its
    /// own [`RepoImporter`]; returns them in layer order. After a failure no new layer starts,
    /// and the error reported is that of the first failed layer.
    ///
    /// The largest layers start first: the import is done when its last layer is, and a large
    /// layer started last leaves one core alone with it. ostree-rs-ext's chunking orders layers
    /// by its packing, not by size: in the bench's 65-layer image, the second-largest layer
    /// (a tenth of the bytes) is the second-to-last.
    pub(super) fn import_each_layer(
        &self,
        repo: &ostree::Repo,
        spools: &Spools,
        staging: Option<&Arc<import::Staging>>,
    ) -> Result<Vec<RepoImporter>> {
        let count = self.os.layers.len();
        let order = largest_first(&self.os.layers);
        let order = &order;
        let next = AtomicUsize::new(0);
        let failed = AtomicBool::new(false);
        let mut done: Vec<(usize, Result<RepoImporter>)> = std::thread::scope(|scope| {
            let (next, failed) = (&next, &failed);
            let workers: Vec<_> = (0..PARALLEL_LAYERS.min(count))
                .map(|_| {
                    // A repo handle may move between threads but not be shared by them.
                    let repo = repo.clone();
                    scope.spawn(move || {
                        let mut done = Vec::new();
                        while let Some(group) = order.get(next.fetch_add(1, Ordering::Relaxed)) {
                            for &i in group {
                                if failed.load(Ordering::Relaxed) {
                                    return done;
                                }
                                let imported = self.import_layer(&repo, spools, staging, i);
                                failed.fetch_or(imported.is_err(), Ordering::Relaxed);
                                done.push((i, imported));
                            }
                        }
                        done
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| {
                    w.join().unwrap_or_else(|_| {
                        vec![(0, Err(anyhow::anyhow!("a layer import thread panicked")))]
                    })
                })
                .collect()
        });
        done.sort_by_key(|(i, _)| *i);
        done.into_iter().map(|(_, imported)| imported).collect()
    }
}


/// Layer indices grouped by digest, the groups largest (compressed) first, equal sizes in
/// layer order. A group holds more than one layer when the image carries a blob twice (OCI
/// allows it; a build step can repeat a layer): one worker imports them one after the other,
/// as two imports of one blob at once would append to the same download spool.
fn largest_first(layers: &[Layer]) -> Vec<Vec<usize>> {
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (i, layer) in layers.iter().enumerate() {
        match first.entry(layer.descriptor.digest.as_str()) {
            Entry::Occupied(g) => groups[*g.get()].push(i),
            Entry::Vacant(v) => {
                v.insert(groups.len());
                groups.push(vec![i]);
            }
        }
    }
    groups.sort_by_key(|g| std::cmp::Reverse(layers[g[0]].descriptor.size.max(0)));
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fetch::image::Compression;

    fn layer(size: i64) -> Layer {
        sized(&format!("sha256:{size}"), size)
    }

    fn sized(digest: &str, size: i64) -> Layer {
        Layer {
            descriptor: oci_client::manifest::OciDescriptor {
                digest: digest.to_string(),
                size,
                ..Default::default()
            },
            compression: Compression::Gzip,
            derived: false,
        }
    }

    #[test]
    fn the_largest_layers_are_imported_first() {
        // As ostree-rs-ext orders a chunked image: commit layer, then its packing's bins.
        let layers: Vec<Layer> = [1, 8, 7, 6, 2, 47, 24, 27, 3].map(layer).into();
        let order: Vec<usize> = largest_first(&layers).concat();
        assert_eq!(order, [5, 7, 6, 1, 2, 3, 8, 4, 0]);
        // Equal sizes keep layer order.
        let layers = [sized("sha256:a", 5), sized("sha256:b", 9), sized("sha256:c", 5)];
        assert_eq!(largest_first(&layers), [vec![1], vec![0], vec![2]]);
    }

    #[test]
    fn a_blob_the_image_carries_twice_is_imported_by_one_worker_in_layer_order() {
        let layers = [
            sized("sha256:run", 4),
            sized("sha256:base", 9),
            sized("sha256:run", 4),
            sized("sha256:copy", 6),
            sized("sha256:run", 4),
        ];
        assert_eq!(
            largest_first(&layers),
            [vec![1], vec![3], vec![0, 2, 4]]
        );
    }
}
