//! Deterministic tar layers from directories on disk, and their compression.

use anyhow::{bail, Context, Result};
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// Fixed mtime for every tar entry, so equal inputs give equal layer digests.
const TAR_MTIME: u64 = 1_700_000_000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    Gzip,
    Zstd,
    None,
}

#[derive(Clone, Debug)]
pub(crate) enum Kind {
    Dir { mode: u32 },
    File { mode: u32, source: PathBuf },
    Symlink { target: PathBuf },
}

/// One tar entry: archive path (no leading or trailing slash) and what it is.
#[derive(Clone, Debug)]
pub(crate) struct Item {
    pub path: String,
    pub kind: Kind,
}

/// Everything under `dir`, named `<prefix>/<relative path>`, sorted by name.
/// `skip` gets the relative path and drops matching entries (and their subtrees).
pub(crate) fn walk(dir: &Path, prefix: &str, skip: &dyn Fn(&str) -> bool) -> Result<Vec<Item>> {
    let mut out = Vec::new();
    walk_into(dir, "", prefix, skip, &mut out)?;
    Ok(out)
}

fn walk_into(
    dir: &Path,
    rel: &str,
    prefix: &str,
    skip: &dyn Fn(&str) -> bool,
    out: &mut Vec<Item>,
) -> Result<()> {
    let mut names: Vec<_> = fs::read_dir(dir)
        .with_context(|| format!("listing {}", dir.display()))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<std::io::Result<_>>()
        .with_context(|| format!("listing {}", dir.display()))?;
    names.sort();
    for name in names {
        let path = dir.join(&name);
        let name = name.to_str().context("non-UTF-8 file name")?;
        let rel = if rel.is_empty() {
            name.to_string()
        } else {
            format!("{rel}/{name}")
        };
        if skip(&rel) {
            continue;
        }
        let meta = path
            .symlink_metadata()
            .with_context(|| format!("stat {}", path.display()))?;
        let mode = meta.permissions().mode() & 0o7777;
        let archive_path = if prefix.is_empty() {
            rel.clone()
        } else {
            format!("{prefix}/{rel}")
        };
        let kind = if meta.file_type().is_symlink() {
            let target =
                fs::read_link(&path).with_context(|| format!("readlink {}", path.display()))?;
            Kind::Symlink { target }
        } else if meta.is_dir() {
            Kind::Dir { mode }
        } else if meta.is_file() {
            Kind::File {
                mode,
                source: path.clone(),
            }
        } else {
            bail!("unsupported file type at {}", path.display());
        };
        let is_dir = matches!(kind, Kind::Dir { .. });
        out.push(Item {
            path: archive_path,
            kind,
        });
        if is_dir {
            walk_into(&path, &rel, prefix, skip, out)?;
        }
    }
    Ok(())
}

/// Splits items into `n` layers: layer 0 holds every directory plus the first
/// share of non-directories; later layers hold their share plus its parent dirs.
pub(crate) fn split(items: &[Item], n: usize) -> Vec<Vec<Item>> {
    let n = n.max(1);
    let (dirs, files): (Vec<&Item>, Vec<&Item>) = items
        .iter()
        .partition(|i| matches!(i.kind, Kind::Dir { .. }));
    let per = files.len().div_ceil(n).max(1);
    let mut layers = Vec::with_capacity(n);
    for k in 0..n {
        let share: Vec<&Item> = files.iter().skip(k * per).take(per).copied().collect();
        let mut layer: Vec<Item> = dirs
            .iter()
            .filter(|d| {
                k == 0
                    || share
                        .iter()
                        .any(|f| f.path.starts_with(&format!("{}/", d.path)))
            })
            .map(|d| (*d).clone())
            .collect();
        layer.extend(share.into_iter().cloned());
        // Name order puts every parent before its children.
        layer.sort_by(|a, b| a.path.cmp(&b.path));
        layers.push(layer);
    }
    layers
}

/// An uncompressed tar of `items`, owned by root with a fixed mtime.
pub(crate) fn tar(items: &[Item]) -> Result<Vec<u8>> {
    let mut builder = tar::Builder::new(Vec::new());
    for item in items {
        let mut header = tar::Header::new_gnu();
        header.set_uid(0);
        header.set_gid(0);
        header.set_mtime(TAR_MTIME);
        match &item.kind {
            Kind::Dir { mode } => {
                header.set_entry_type(tar::EntryType::Directory);
                header.set_mode(*mode);
                header.set_size(0);
                builder.append_data(&mut header, format!("{}/", item.path), std::io::empty())
            }
            Kind::File { mode, source } => {
                let data =
                    fs::read(source).with_context(|| format!("reading {}", source.display()))?;
                header.set_entry_type(tar::EntryType::Regular);
                header.set_mode(*mode);
                header.set_size(data.len() as u64);
                builder.append_data(&mut header, &item.path, data.as_slice())
            }
            Kind::Symlink { target } => {
                header.set_entry_type(tar::EntryType::Symlink);
                header.set_mode(0o777);
                header.set_size(0);
                builder.append_link(&mut header, &item.path, target)
            }
        }
        .with_context(|| format!("adding {} to tar", item.path))?;
    }
    builder.into_inner().context("finishing tar")
}

pub(crate) fn compress(data: &[u8], compression: Compression) -> Result<Vec<u8>> {
    match compression {
        Compression::Gzip => {
            let mut enc = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
            enc.write_all(data).context("gzip")?;
            enc.finish().context("gzip")
        }
        Compression::Zstd => zstd::encode_all(data, 3).context("zstd"),
        Compression::None => Ok(data.to_vec()),
    }
}
