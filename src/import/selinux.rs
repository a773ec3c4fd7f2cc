//! SELinux labels for what the derived layers of an ostree-native image add, from the base
//! commit's policy, as ostree-rs-ext labels a derived layer (`ostree commit --selinux-policy`
//! with the base's `/usr/etc/selinux`): each new file and directory gets the
//! `security.selinux` label the policy's file contexts give its path in the commit (`/usr/…`,
//! `/usr/etc/…` as it is stored). A layer's tar carries no labels worth keeping (container
//! builds run unlabeled), so without this an enforcing node would find the derived files
//! unlabeled. A base without a policy labels nothing. Files of the base keep the labels their
//! commit carries, as built.
//!
//! Objects are written unlabeled while the layer streams in (the base may not be imported yet);
//! once the base is complete, each derived object is written again with its label and the tree
//! names the labeled one. The unlabeled copies are left to the prune.

use std::cell::RefCell;
use std::collections::HashMap;

use anyhow::{Context, Result};
use ostree::gio;
use ostree::glib;
use ostree::glib::prelude::*;
use ostree::ObjectType;

const XATTR: &[u8] = b"security.selinux\0";

pub(super) struct Labels {
    policy: ostree::SePolicy,
    /// (object, label) → labeled object, so a file added twice is written once.
    written: RefCell<HashMap<(String, String), String>>,
}

impl Labels {
    /// The policy of `commit`; None when it has none (no `/usr/etc/selinux/config`).
    pub fn of_commit(repo: &ostree::Repo, commit: &str) -> Result<Option<Labels>> {
        let policy = ostree::SePolicy::from_commit(repo, commit, gio::Cancellable::NONE)
            .with_context(|| format!("reading the SELinux policy of commit {commit}"))?;
        if policy.name().is_none_or(|n| n.is_empty()) {
            return Ok(None);
        }
        Ok(Some(Labels {
            policy,
            written: RefCell::default(),
        }))
    }

    fn label(&self, path: &str, mode: u32) -> Result<Option<String>> {
        let absolute = format!("/{path}");
        Ok(self
            .policy
            .label(&absolute, mode, gio::Cancellable::NONE)
            .with_context(|| format!("labeling {absolute}"))?
            .map(|l| l.to_string()))
    }

    /// The content object `checksum` at `path`, labeled.
    pub fn file(&self, repo: &ostree::Repo, path: &str, checksum: &str) -> Result<String> {
        let cancellable = gio::Cancellable::NONE;
        let (input, info, xattrs) = repo
            .load_file(checksum, cancellable)
            .with_context(|| format!("reading file object {checksum}"))?;
        let mode = info.attribute_uint32("unix::mode");
        let Some(label) = self.label(path, mode)? else {
            return Ok(checksum.to_string());
        };
        let key = (checksum.to_string(), label.clone());
        if let Some(done) = self.written.borrow().get(&key) {
            return Ok(done.clone());
        }
        let xattrs = with_label(&xattrs, &label);
        let labeled = match input {
            Some(input) => {
                let (stream, size) =
                    ostree::raw_file_to_content_stream(&input, &info, Some(&xattrs), cancellable)?;
                repo.write_content(None, &stream, size, cancellable)
                    .map(|c| c.to_string())
            }
            None => repo
                .write_symlink(
                    None,
                    info.attribute_uint32("unix::uid"),
                    info.attribute_uint32("unix::gid"),
                    Some(&xattrs),
                    &info.symlink_target().unwrap_or_default().to_string_lossy(),
                    cancellable,
                )
                .map(|c| c.to_string()),
        }
        .with_context(|| format!("writing {path} labeled {label}"))?;
        self.written.borrow_mut().insert(key, labeled.clone());
        Ok(labeled)
    }

    /// The dirmeta `dirmeta` of the directory at `path`, labeled.
    pub fn dirmeta(&self, repo: &ostree::Repo, path: &str, dirmeta: &str) -> Result<String> {
        let meta = repo
            .load_variant(ObjectType::DirMeta, dirmeta)
            .with_context(|| format!("reading dirmeta {dirmeta}"))?;
        let field = |i| u32::from_be(meta.child_value(i).get::<u32>().unwrap_or_default());
        let (uid, gid, mode) = (field(0), field(1), field(2));
        let Some(label) = self.label(path, mode)? else {
            return Ok(dirmeta.to_string());
        };
        let info = gio::FileInfo::new();
        info.set_attribute_uint32("unix::uid", uid);
        info.set_attribute_uint32("unix::gid", gid);
        info.set_attribute_uint32("unix::mode", mode);
        let labeled = ostree::create_directory_metadata(
            &info,
            Some(&with_label(&meta.child_value(3), &label)),
        );
        Ok(repo
            .write_metadata(ObjectType::DirMeta, None, &labeled, gio::Cancellable::NONE)
            .with_context(|| format!("writing the dirmeta of {path}"))?
            .to_hex())
    }
}

/// `xattrs` (`a(ayay)`) with `security.selinux` set to `label` (NUL-terminated, as libostree
/// writes it).
fn with_label(xattrs: &glib::Variant, label: &str) -> glib::Variant {
    let mut all: Vec<(Vec<u8>, Vec<u8>)> = xattrs
        .iter()
        .filter_map(|x| x.get::<(Vec<u8>, Vec<u8>)>())
        .filter(|(name, _)| name != XATTR)
        .collect();
    let mut value = label.as_bytes().to_vec();
    value.push(0);
    all.push((XATTR.to_vec(), value));
    all.sort();
    all.to_variant()
}
