use super::*;

#[test]
fn repo_mode_is_read_from_config() {
    assert_eq!(
        repo_mode("[core]\nrepo_version=1\nmode=archive-z2\n").as_deref(),
        Some("archive-z2")
    );
    assert_eq!(repo_mode("garbage"), None);
}

/// A layer of large objects imported by a pool of writers, with checkpoints: each checkpoint
/// names only objects already staged when it is saved and the layer as it was at its member
/// (the ref, the last member, is in none of them), though the import read on meanwhile; the
/// record at the end names every object.
#[test]
fn checkpoints_name_only_staged_objects_while_the_pool_writes_on() {
    use crate::import::objects::tests::{bare_repo_in_transaction, filez_objects, incompressible};
    let dir = tempfile::tempdir().unwrap();
    let contents: Vec<Vec<u8>> = (0..8).map(|i| incompressible((2 << 20) + i * 4096)).collect();
    let names: Vec<String> = (0..8).map(|i| format!("f{i}")).collect();
    let files: Vec<(&str, Vec<u8>)> = names.iter().map(|n| n.as_str()).zip(contents).collect();
    let objects = filez_objects(dir.path(), &files);
    // The archive repo as an oscontainer's layer: config, objects, then the ref.
    let archive = dir.path().join("archive");
    let mut tar = tar::Builder::new(flate2::write::GzEncoder::new(
        Vec::new(),
        flate2::Compression::default(),
    ));
    let mut members = vec![archive.join("config")];
    members.extend(crate::import::objects::tests::walkdir(&archive.join("objects")));
    members.push(archive.join("refs/heads/t"));
    for path in &members {
        let rel = path.strip_prefix(&archive).unwrap();
        tar.append_path_with_name(path, format!("{REPO_DIR}{}", rel.display()))
            .unwrap();
    }
    let layer = tar.into_inner().unwrap().finish().unwrap();

    let repo = bare_repo_in_transaction(dir.path());
    let mut importer = RepoImporter::new(repo.clone(), Format::Legacy, false);
    importer.write_with(2);
    importer.record_objects();
    // Where each file object's member ends in the layer.
    let mut ends = Vec::new();
    let mut tar = tar::Archive::new(flate2::read::GzDecoder::new(&layer[..]));
    for entry in tar.entries().unwrap() {
        let entry = entry.unwrap();
        let path = entry.path().unwrap().to_string_lossy().into_owned();
        if let Some((checksum, "filez")) = path.strip_prefix(REPO_DIR).and_then(|p| {
            let (checksum, ext) = object_name(p.strip_prefix("objects/")?)?;
            Some((checksum, ext))
        }) {
            ends.push((checksum, checkpoint::member_end(&entry)));
        }
    }
    assert_eq!(ends.len(), objects.len());
    let mut saved = 0;
    let mut save = |checkpoint: &LayerCheckpoint<'_>| -> Result<()> {
        let record = &checkpoint.importer;
        let staged = |c: &str| repo.has_object(ObjectType::File, c, gio::Cancellable::NONE);
        // Every object before the checkpoint's member is staged, and it says so: a resumed run
        // starts after that member and would never write them.
        for (checksum, end) in ends.iter().filter(|(_, end)| *end <= checkpoint.member) {
            assert!(staged(checksum).unwrap(), "{checksum} (ends at {end}) is not staged");
            assert!(record.objects.iter().any(|k| &k.checksum() == checksum));
        }
        for key in record.objects.iter() {
            let staged = repo.has_object(key.kind(), &key.checksum(), gio::Cancellable::NONE);
            assert!(staged.unwrap(), "a checkpoint names {key:?} unstaged");
        }
        assert!(record.refs.is_empty(), "a checkpoint holds the ref read after it");
        saved += 1;
        Ok(())
    };
    let checkpoints = Checkpoints {
        resume: None,
        save: &mut save,
    };
    let size = layer.len() as u64;
    let blob = Marked {
        data: &layer,
        read: 0,
        hash: Default::default(),
    };
    (importer.import_blob(blob, Compression::Gzip, size, Some(checkpoints))).unwrap();
    // About 14 fall due (one per MiB of layer); how many are saved depends on how far the
    // writers trail the reading (older ones waiting are passed over for a newer one that is
    // staged), but at least one is once eight wait.
    assert!(saved >= 1, "no checkpoint in a layer of 16 MiB");
    let record = importer.record().unwrap();
    assert_eq!(record.refs.len(), 1);
    for (name, _) in &objects {
        assert!(record.objects.iter().any(|k| &k.checksum() == name), "{name} unrecorded");
    }
}

/// A blob read from memory that says where it is, as a download does: checkpoints need it.
struct Marked<'a> {
    data: &'a [u8],
    read: u64,
    hash: crate::fetch::sha256_state::Sha256State,
}

impl Read for Marked<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.data.read(buf)?;
        self.hash.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

impl Blob for Marked<'_> {
    fn mark(&self) -> Option<crate::fetch::blob_reader::BlobMark> {
        Some(crate::fetch::blob_reader::BlobMark {
            read: self.read,
            hash: self.hash.clone(),
        })
    }
}
