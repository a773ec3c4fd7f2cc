//! The importer: arbitrary bytes as an uncompressed layer (the first byte picks the legacy or
//! the ostree-native format), imported into a temporary archive repo inside a transaction that
//! is then aborted (and its staging removed, as pivot does), so every input starts from the same
//! empty repo. It must never panic, whatever the tar says.
#![no_main]

use libfuzzer_sys::fuzz_target;
use ostree::gio;
use pivot::fetch::image::{Format, OsImage};
use pivot::import::{remove_unheld_staging_dirs, RepoImporter};

struct Scratch {
    _dir: tempfile::TempDir,
    repo: ostree::Repo,
    tmp: std::path::PathBuf,
}

thread_local! {
    static SCRATCH: Scratch = {
        let dir = tempfile::Builder::new().prefix("pivot-fuzz-repo-").tempdir().unwrap();
        let repo = ostree::Repo::new_for_path(dir.path());
        repo.create(ostree::RepoMode::Archive, gio::Cancellable::NONE).unwrap();
        let tmp = dir.path().join("tmp");
        Scratch { _dir: dir, repo, tmp }
    };
}

fuzz_target!(|data: &[u8]| {
    let Some((&pick, layer)) = data.split_first() else {
        return;
    };
    let format = if pick & 1 == 0 {
        Format::Legacy
    } else {
        Format::Native
    };
    let os = OsImage {
        digest: format!("sha256:{}", "0".repeat(64)),
        format,
        commit_label: None,
        base_commit: None,
        version: None,
        layers: Vec::new(),
        manifest_digest: String::new(),
        manifest_json: String::new(),
        config_json: String::new(),
    };
    SCRATCH.with(|s| {
        s.repo
            .prepare_transaction(gio::Cancellable::NONE)
            .expect("preparing a transaction");
        let mut importer = RepoImporter::new(s.repo.clone(), format, false);
        if importer.import_tar(layer).is_ok() {
            let _ = importer.finish(&os);
        }
        s.repo
            .abort_transaction(gio::Cancellable::NONE)
            .expect("aborting the transaction");
        remove_unheld_staging_dirs(&s.tmp);
    });
});
