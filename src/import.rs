//! Importing the OSTree archive repo at `srv/repo` of an oscontainer's layers into the sysroot's
//! repo, straight from the layer streams: each object is written into the caller's open
//! transaction with its expected checksum, so libostree verifies every object and nothing of the
//! image is unpacked to disk. Objects the repo already has are skipped.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{self, Read};
use std::path::Path;

use anyhow::{anyhow, bail, ensure, Context, Result};
use ostree::gio;
use ostree::gio::prelude::IsA;
use ostree::glib;
use ostree::ObjectType;

use crate::image::{is_checksum, Compression};

const REPO_DIR: &str = "srv/repo/";

/// Collects what the layers say about the repo while their objects are written.
pub struct RepoImporter {
    repo: ostree::Repo,
    /// Contents of `srv/repo/config`, if any layer had it.
    config: Option<String>,
    /// ref name → checksum, from `srv/repo/refs/`.
    refs: BTreeMap<String, String>,
    pub objects_written: u64,
    pub objects_skipped: u64,
}

impl RepoImporter {
    /// `repo` must be in a transaction: objects only become visible when the caller commits it.
    /// Several importers may write into one transaction from different threads.
    pub fn new(repo: ostree::Repo) -> Self {
        RepoImporter {
            repo,
            config: None,
            refs: BTreeMap::new(),
            objects_written: 0,
            objects_skipped: 0,
        }
    }

    /// Imports one layer blob: a second thread decompresses it (and checks its digest) while
    /// this one writes objects. The blob is read to its very end even when the import fails
    /// early, because only then is its digest checked: a corrupted blob is reported as one, not
    /// as whatever the corruption broke first.
    pub fn import_blob(&mut self, blob: impl Read + Send, compression: Compression) -> Result<()> {
        let (tx, rx) = std::sync::mpsc::sync_channel(DECOMPRESSED_AHEAD);
        std::thread::scope(|scope| {
            let producer = scope.spawn(move || decompress(blob, compression, tx));
            let imported = self.import_tar(ChunkReader {
                rx,
                current: Vec::new(),
                pos: 0,
            });
            let produced = producer
                .join()
                .map_err(|_| anyhow!("the decompression thread panicked"))?;
            match (produced, imported) {
                // A bad blob or a broken stream explains whatever the import then tripped on.
                (Err(e), _) => Err(e),
                (Ok(()), imported) => imported,
            }
        })
    }

    /// Takes in what `later` (the importer of a later layer) found: its config and refs win.
    pub fn absorb(&mut self, later: RepoImporter) {
        if later.config.is_some() {
            self.config = later.config;
        }
        self.refs.extend(later.refs);
        self.objects_written += later.objects_written;
        self.objects_skipped += later.objects_skipped;
    }

    fn import_tar(&mut self, reader: impl Read) -> Result<()> {
        let mut archive = tar::Archive::new(reader);
        for entry in archive.entries().context("reading the layer as tar")? {
            let mut entry = entry.context("reading the layer as tar")?;
            let path = entry.path().context("reading a tar member's name")?;
            let path = normalize(&path.to_string_lossy());
            let Some(rel) = path.strip_prefix(REPO_DIR) else {
                continue;
            };
            let rel = rel.to_string();
            let kind = entry.header().entry_type();
            if kind.is_dir() {
                continue;
            }
            let context = || format!("importing {REPO_DIR}{rel}");
            if rel == "config" {
                ensure!(kind.is_file(), "{REPO_DIR}config is not a regular file");
                self.config = Some(read_text(&mut entry).with_context(context)?);
            } else if let Some(name) = rel.strip_prefix("refs/heads/") {
                self.read_ref(name.to_string(), kind, &mut entry)
                    .with_context(context)?;
            } else if let Some(name) = rel.strip_prefix("refs/remotes/") {
                let name = name.replacen('/', ":", 1);
                self.read_ref(name, kind, &mut entry)
                    .with_context(context)?;
            } else if let Some(obj) = rel.strip_prefix("objects/") {
                if let Some((checksum, ext)) = object_name(obj) {
                    ensure!(
                        kind.is_file(),
                        "object {rel} is not a regular file ({kind:?})"
                    );
                    self.write_object(&checksum, ext, &mut entry)
                        .with_context(context)?;
                }
            }
        }
        Ok(())
    }

    fn read_ref(
        &mut self,
        name: String,
        kind: tar::EntryType,
        entry: &mut impl Read,
    ) -> Result<()> {
        ensure!(kind.is_file(), "ref {name} is not a regular file");
        let target = read_text(entry)?.trim().to_string();
        ensure!(
            is_checksum(&target),
            "ref {name} does not hold a commit checksum"
        );
        self.refs.insert(name, target);
        Ok(())
    }

    fn write_object(
        &mut self,
        checksum: &str,
        ext: &str,
        entry: &mut tar::Entry<impl Read>,
    ) -> Result<()> {
        let objtype = match ext {
            "commit" => ObjectType::Commit,
            "dirtree" => ObjectType::DirTree,
            "dirmeta" => ObjectType::DirMeta,
            "filez" => ObjectType::File,
            "commitmeta" => return self.write_commitmeta(checksum, entry),
            // Signatures, tombstones and the like carry nothing a deployment needs.
            _ => return Ok(()),
        };
        let cancellable = gio::Cancellable::NONE;
        if self.repo.has_object(objtype, checksum, cancellable)? {
            self.objects_skipped += 1;
            return Ok(());
        }
        let size = entry.size();
        if objtype == ObjectType::File {
            if size <= IN_MEMORY_OBJECT {
                let mut data = Vec::with_capacity(size as usize);
                entry.read_to_end(&mut data)?;
                let input = gio::MemoryInputStream::from_bytes(&glib::Bytes::from_owned(data));
                write_filez(&self.repo, checksum, input, size)?;
            } else {
                write_filez_streaming(&self.repo, checksum, entry, size)?;
            }
        } else {
            ensure!(
                size <= MAX_METADATA_OBJECT,
                "metadata object of {size} bytes is larger than the {MAX_METADATA_OBJECT} accepted"
            );
            let mut data = Vec::with_capacity(size as usize);
            entry.read_to_end(&mut data)?;
            let bytes = glib::Bytes::from_owned(data);
            let variant = glib::Variant::from_bytes_with_type(&bytes, metadata_type(objtype));
            self.repo
                .write_metadata(objtype, Some(checksum), &variant, cancellable)
                .context("writing metadata object")?;
        }
        self.objects_written += 1;
        Ok(())
    }

    fn write_commitmeta(&mut self, checksum: &str, entry: &mut impl Read) -> Result<()> {
        let mut data = Vec::new();
        entry.read_to_end(&mut data)?;
        let variant = glib::Variant::from_bytes_with_type(
            &glib::Bytes::from_owned(data),
            glib::VariantTy::VARDICT,
        );
        self.repo
            .write_commit_detached_metadata(checksum, Some(&variant), gio::Cancellable::NONE)
            .context("writing detached commit metadata")
    }

    /// Picks the commit to deploy (the label's, else the repo's single ref) and checks that
    /// every object it reaches is now in the repo.
    pub fn finish(self, commit_label: Option<&str>) -> Result<String> {
        let Some(config) = &self.config else {
            bail!("the image has no OSTree repository at {REPO_DIR} (no {REPO_DIR}config in any layer)");
        };
        let mode = repo_mode(config);
        ensure!(
            matches!(mode.as_deref(), Some("archive-z2" | "archive")),
            "{REPO_DIR} is a {:?} repository; an oscontainer carries an archive repository",
            mode.unwrap_or_default()
        );
        let commit = match commit_label {
            Some(label) => label.to_string(),
            None => match self.refs.len() {
                0 => bail!(
                    "the image has no {} label and its repository has no ref to fall back on",
                    crate::image::COMMIT_LABEL
                ),
                1 => self.refs.values().next().unwrap().clone(),
                _ => bail!(
                    "the image has no {} label and its repository has several refs ({}): cannot tell which commit to deploy",
                    crate::image::COMMIT_LABEL,
                    self.refs.keys().cloned().collect::<Vec<_>>().join(", ")
                ),
            },
        };
        let cancellable = gio::Cancellable::NONE;
        ensure!(
            self.repo
                .has_object(ObjectType::Commit, &commit, cancellable)?,
            "commit {commit} is not in the image's repository"
        );
        verify_complete(&self.repo, &commit)?;
        Ok(commit)
    }
}

/// Writes an archive-z2 "filez" object (a header, then zlib-compressed content) with libostree
/// checking it hashes to `checksum`.
fn write_filez(
    repo: &ostree::Repo,
    checksum: &str,
    input: impl IsA<gio::InputStream>,
    size: u64,
) -> Result<()> {
    let cancellable = gio::Cancellable::NONE;
    let (content, info, xattrs) =
        ostree::content_stream_parse(true, &input, size, false, cancellable)
            .context("parsing archived file object")?;
    let (stream, length) =
        ostree::raw_file_to_content_stream(&content, &info, Some(&xattrs), cancellable)?;
    repo.write_content(Some(checksum), &stream, length, cancellable)
        .context("writing file object")?;
    Ok(())
}

/// A large file object streams from the tar member to libostree through a small channel, so
/// memory stays bounded whatever the file's size: libostree reads on a helper thread while this
/// one feeds it.
fn write_filez_streaming(
    repo: &ostree::Repo,
    checksum: &str,
    entry: &mut impl Read,
    size: u64,
) -> Result<()> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(4);
    std::thread::scope(|scope| {
        let repo = repo.clone();
        let writer = scope.spawn(move || {
            let input = gio::ReadInputStream::new(ChunkReader {
                rx,
                current: Vec::new(),
                pos: 0,
            });
            write_filez(&repo, checksum, input, size)
        });
        let mut fed = Ok(());
        loop {
            let mut chunk = vec![0; STREAM_CHUNK];
            match entry.read(&mut chunk) {
                Ok(0) => break,
                Ok(n) => {
                    chunk.truncate(n);
                    // The writer stopped early (it failed): its error says why.
                    if tx.send(chunk).is_err() {
                        break;
                    }
                }
                Err(e) => {
                    fed = Err(anyhow!(e));
                    break;
                }
            }
        }
        drop(tx);
        let written = writer
            .join()
            .map_err(|_| anyhow!("the object writer panicked"))?;
        fed.and(written)
    })
}

/// Decompressed chunks buffered between the two threads (each [`STREAM_CHUNK`]).
const DECOMPRESSED_AHEAD: usize = 8;

/// Sends the decompressed layer in chunks, then reads the rest of the blob, so that its digest
/// is checked even when the consumer stopped early.
fn decompress(
    mut blob: impl Read,
    compression: Compression,
    tx: std::sync::mpsc::SyncSender<Vec<u8>>,
) -> Result<()> {
    let sent = (|| -> Result<()> {
        let mut decoder: Box<dyn Read + '_> = match compression {
            Compression::None => Box::new(&mut blob),
            Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(&mut blob)),
            Compression::Zstd => {
                Box::new(zstd::Decoder::new(&mut blob).context("starting zstd decompression")?)
            }
        };
        loop {
            let mut chunk = vec![0; STREAM_CHUNK];
            let n = decoder
                .read(&mut chunk)
                .context("decompressing the layer")?;
            if n == 0 {
                return Ok(());
            }
            chunk.truncate(n);
            if tx.send(chunk).is_err() {
                return Ok(()); // The importer stopped; its error says why.
            }
        }
    })();
    drop(tx);
    let drained = io::copy(&mut blob, &mut io::sink());
    match (drained, sent) {
        (Err(e), _) => Err(anyhow!(e)),
        (Ok(_), sent) => sent,
    }
}

/// Objects up to this size are written from memory; larger ones are streamed.
const IN_MEMORY_OBJECT: u64 = 1 << 20;
const STREAM_CHUNK: usize = 128 << 10;
/// Commit, dirtree and dirmeta objects are small; this bounds what a hostile image can make
/// pivot hold in memory.
const MAX_METADATA_OBJECT: u64 = 64 << 20;

struct ChunkReader {
    rx: std::sync::mpsc::Receiver<Vec<u8>>,
    current: Vec<u8>,
    pos: usize,
}

impl Read for ChunkReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos == self.current.len() {
            match self.rx.recv() {
                Ok(chunk) => {
                    self.current = chunk;
                    self.pos = 0;
                }
                Err(_) => return Ok(0),
            }
        }
        let n = buf.len().min(self.current.len() - self.pos);
        buf[..n].copy_from_slice(&self.current[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}

/// Every object reachable from `commit` must be present before the commit may be deployed.
pub fn verify_complete(repo: &ostree::Repo, commit: &str) -> Result<()> {
    // traverse_commit() quietly returns nothing for a commit that is not there at all.
    ensure!(
        repo.has_object(ObjectType::Commit, commit, gio::Cancellable::NONE)?,
        "commit {commit} is not in the repo"
    );
    let objects = repo
        .traverse_commit(commit, 0, gio::Cancellable::NONE)
        .with_context(|| format!("commit {commit} is incomplete"))?;
    for object in objects {
        if object.object_type() == ObjectType::File
            && !repo.has_object(ObjectType::File, object.checksum(), gio::Cancellable::NONE)?
        {
            bail!(
                "commit {commit} is incomplete: file object {} is missing",
                object.checksum()
            );
        }
    }
    Ok(())
}

/// The `staging-*` directories libostree keeps under the repo's `tmp/`.
pub fn staging_dirs(tmp: &Path) -> BTreeSet<OsString> {
    std::fs::read_dir(tmp)
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name())
        .filter(|n| n.to_string_lossy().starts_with("staging-"))
        .collect()
}

/// Removes the staging directories that appeared since `before` and that no transaction holds:
/// libostree keeps an aborted transaction's objects there for a later one to reuse, but a
/// refused image must not leave its objects behind. A holder has `<name>-lock` open beside it.
pub fn remove_new_staging_dirs(tmp: &Path, before: &BTreeSet<OsString>) {
    for name in staging_dirs(tmp).difference(before) {
        let name = name.to_string_lossy();
        if name.ends_with("-lock") || tmp.join(format!("{name}-lock")).exists() {
            continue;
        }
        if let Err(e) = std::fs::remove_dir_all(tmp.join(&*name)) {
            tracing::warn!("could not free {}: {e}", tmp.join(&*name).display());
        }
    }
}

fn metadata_type(objtype: ObjectType) -> &'static glib::VariantTy {
    let ty = match objtype {
        ObjectType::Commit => "(a{sv}aya(say)sstayay)",
        ObjectType::DirTree => "(a(say)a(sayay))",
        _ => "(uuua(ayay))",
    };
    glib::VariantTy::new(ty).expect("static variant type")
}

/// `./srv/repo/x` and `/srv/repo/x` name the same member as `srv/repo/x`.
fn normalize(path: &str) -> String {
    let mut p = path;
    loop {
        if let Some(rest) = p.strip_prefix("./") {
            p = rest;
        } else if let Some(rest) = p.strip_prefix('/') {
            p = rest;
        } else {
            return p.to_string();
        }
    }
}

/// `ab/cdef….ext` → (`abcdef…`, `ext`) for a well-formed object path.
fn object_name(rel: &str) -> Option<(String, &str)> {
    let (prefix, file) = rel.split_once('/')?;
    let (rest, ext) = file.split_once('.')?;
    let checksum = format!("{prefix}{rest}");
    (prefix.len() == 2 && is_checksum(&checksum)).then_some((checksum, ext))
}

fn read_text(entry: &mut impl Read) -> Result<String> {
    let mut text = String::new();
    entry.take(1 << 20).read_to_string(&mut text)?;
    Ok(text)
}

/// `mode=` of the `[core]` group of an ostree repo config.
fn repo_mode(config: &str) -> Option<String> {
    let keyfile = glib::KeyFile::new();
    keyfile
        .load_from_data(config, glib::KeyFileFlags::NONE)
        .ok()?;
    keyfile.string("core", "mode").ok().map(|s| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_paths_are_recognised() {
        let hex = "ab".to_string() + &"c".repeat(62);
        let path = format!("ab/{}.filez", "c".repeat(62));
        let (csum, ext) = object_name(&path).unwrap();
        assert_eq!((csum.as_str(), ext), (hex.as_str(), "filez"));
        assert!(object_name("ab/short.filez").is_none());
        assert!(object_name(&format!("abc/{}.filez", &"c".repeat(61))).is_none());
    }

    #[test]
    fn member_names_are_normalized() {
        assert_eq!(normalize("./srv/repo/config"), "srv/repo/config");
        assert_eq!(normalize("/./srv/repo"), "srv/repo");
    }

    #[test]
    fn repo_mode_is_read_from_config() {
        assert_eq!(
            repo_mode("[core]\nrepo_version=1\nmode=archive-z2\n").as_deref(),
            Some("archive-z2")
        );
        assert_eq!(repo_mode("garbage"), None);
    }
}
