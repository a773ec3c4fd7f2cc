//! Reading files of a commit straight from the repo (no checkout): the kernel a commit boots
//! ([`crate::sysroot::space`]), the kernel arguments it ships ([`crate::sysroot::kargs_d`]), the
//! package database it carries ([`crate::sysroot::packages`]). Nothing follows a symlink: a
//! commit's links point into the deployment it becomes, not into the repo.

use std::io::Read;

use anyhow::{ensure, Context, Result};
use ostree::gio;
use ostree::gio::prelude::*;

/// The commit's root directory.
pub(crate) fn root(repo: &ostree::Repo, commit: &str) -> Result<gio::File> {
    let (root, _) = repo
        .read_commit(commit, gio::Cancellable::NONE)
        .with_context(|| format!("reading commit {commit}"))?;
    Ok(root)
}

/// The content of a regular file of a commit.
pub(crate) fn content(repo: &ostree::Repo, file: &gio::File) -> Result<gio::InputStream> {
    let file = file
        .downcast_ref::<ostree::RepoFile>()
        .context("not a file of the repo")?;
    file.ensure_resolved()?;
    let (input, _, _) = repo.load_file(&file.checksum(), gio::Cancellable::NONE)?;
    input.context("no content")
}

/// The whole content of the regular file `path` of the commit whose root is `root`, if there is
/// one; refused above `limit` bytes (these are small files a tree ships, read into memory).
pub(crate) fn read(
    repo: &ostree::Repo,
    root: &gio::File,
    path: &str,
    limit: u64,
) -> Result<Option<Vec<u8>>> {
    let file = root.resolve_relative_path(path);
    let Some((file, size)) = regular_file(&file)? else {
        return Ok(None);
    };
    ensure!(size <= limit, "/{path}: {size} bytes, more than the {limit} read");
    let mut bytes = Vec::with_capacity(size as usize);
    content(repo, &file)?
        .into_read()
        .take(limit)
        .read_to_end(&mut bytes)
        .with_context(|| format!("reading /{path}"))?;
    Ok(Some(bytes))
}

pub(crate) fn file_type(file: &gio::File) -> Result<Option<gio::FileType>> {
    match file.query_info(
        "standard::type,standard::size",
        gio::FileQueryInfoFlags::NOFOLLOW_SYMLINKS,
        gio::Cancellable::NONE,
    ) {
        Ok(info) => Ok(Some(info.file_type())),
        Err(_) if !file.query_exists(gio::Cancellable::NONE) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", file.uri())),
    }
}

/// `file` and its size, if it is a regular file (libostree follows no symlink here either).
pub(crate) fn regular_file(file: &gio::File) -> Result<Option<(gio::File, u64)>> {
    match file.query_info(
        "standard::type,standard::size",
        gio::FileQueryInfoFlags::NOFOLLOW_SYMLINKS,
        gio::Cancellable::NONE,
    ) {
        Ok(info) if info.file_type() == gio::FileType::Regular => {
            Ok(Some((file.clone(), info.size().max(0) as u64)))
        }
        Ok(_) => Ok(None),
        Err(_) if !file.query_exists(gio::Cancellable::NONE) => Ok(None),
        Err(e) => Err(e).with_context(|| format!("reading {}", file.uri())),
    }
}

/// The names and types in directory `dir`, sorted by name; `None` if there is no such directory.
pub(crate) fn children(dir: &gio::File) -> Result<Option<Vec<(String, gio::FileType)>>> {
    // A repo file reports a missing path with an error outside GIO's NotFound.
    if file_type(dir)? != Some(gio::FileType::Directory) {
        return Ok(None);
    }
    let entries = match dir.enumerate_children(
        "standard::name,standard::type",
        gio::FileQueryInfoFlags::NOFOLLOW_SYMLINKS,
        gio::Cancellable::NONE,
    ) {
        Ok(entries) => entries,
        Err(e)
            if e.matches(gio::IOErrorEnum::NotFound)
                || e.matches(gio::IOErrorEnum::NotDirectory) =>
        {
            return Ok(None)
        }
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.uri())),
    };
    let mut out = Vec::new();
    for info in entries {
        let info = info.with_context(|| format!("listing {}", dir.uri()))?;
        out.push((info.name().to_string_lossy().into_owned(), info.file_type()));
    }
    out.sort();
    Ok(Some(out))
}


/// For tests: commits the directory `tree` into `repo`, in the transaction the caller opened;
/// returns the commit's checksum.
#[cfg(test)]
pub(crate) fn commit_dir(repo: &ostree::Repo, tree: &std::path::Path) -> String {
    let none = gio::Cancellable::NONE;
    let mtree = ostree::MutableTree::new();
    repo.write_directory_to_mtree(&gio::File::for_path(tree), &mtree, None, none)
        .unwrap();
    let root = repo.write_mtree(&mtree, none).unwrap();
    let root = ostree::glib::object::Cast::downcast::<ostree::RepoFile>(root).unwrap();
    repo.write_commit(None, None, None, None, &root, none)
        .unwrap()
        .to_string()
}
