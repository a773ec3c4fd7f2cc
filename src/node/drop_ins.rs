//! Drop-in directories with vendor defaults, as systemd and zincati read theirs: an image
//! builder ships files in `/usr/lib/pivot/<dir>/`, the admin's in `/etc/pivot/<dir>/` replace
//! them by name (a file of the same name in /etc masks the vendor's; a link to `/dev/null`
//! masks it and adds nothing), and the result is taken in file-name order, whichever directory
//! each file came from. Hidden files (`.name`) are skipped.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};

/// Where vendor defaults live, relative to the system's root.
pub const VENDOR_DIR: &str = "usr/lib/pivot";
/// Where the admin's files live, relative to the system's `/etc`.
pub const ADMIN_DIR: &str = "pivot";

/// The files of drop-in directory `name` (e.g. `config.d`) for the system whose `/etc` is
/// `etc` (its root is `etc`'s parent), in the order they apply.
pub fn list(etc: &Path, name: &str) -> Result<Vec<PathBuf>> {
    let root = etc.parent().unwrap_or(Path::new("/"));
    let mut by_name: BTreeMap<OsString, PathBuf> = BTreeMap::new();
    for dir in [
        root.join(VENDOR_DIR).join(name),
        etc.join(ADMIN_DIR).join(name),
    ] {
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(e).with_context(|| format!("reading {}", dir.display())),
        };
        for entry in entries {
            let path = entry
                .with_context(|| format!("reading {}", dir.display()))?
                .path();
            let Some(file) = path.file_name().map(|n| n.to_os_string()) else {
                continue;
            };
            if file.as_encoded_bytes().starts_with(b".") {
                continue;
            }
            by_name.insert(file, path);
        }
    }
    Ok(by_name
        .into_values()
        .filter(|path| !is_mask(path))
        .collect())
}

/// A link to `/dev/null`: the file of that name is masked.
fn is_mask(path: &Path) -> bool {
    std::fs::read_link(path).is_ok_and(|target| target == Path::new("/dev/null"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etc_replaces_and_masks_the_vendors_files_by_name() {
        let root = tempfile::tempdir().unwrap();
        let vendor = root.path().join(VENDOR_DIR).join("config.d");
        let admin = root.path().join("etc").join(ADMIN_DIR).join("config.d");
        std::fs::create_dir_all(&vendor).unwrap();
        std::fs::create_dir_all(&admin).unwrap();
        for name in ["10-a.toml", "20-b.toml", "30-c.toml", ".hidden"] {
            std::fs::write(vendor.join(name), "").unwrap();
        }
        std::fs::write(admin.join("20-b.toml"), "").unwrap();
        std::fs::write(admin.join("15-d.toml"), "").unwrap();
        std::os::unix::fs::symlink("/dev/null", admin.join("30-c.toml")).unwrap();
        let listed = list(&root.path().join("etc"), "config.d").unwrap();
        assert_eq!(
            listed,
            [
                vendor.join("10-a.toml"),
                admin.join("15-d.toml"),
                admin.join("20-b.toml"),
            ]
        );
        assert!(list(&root.path().join("etc"), "health.d").unwrap().is_empty());
    }
}
