//! The checked-in schemas (`docs/*.schema.json`) are what the types generate: a change to the
//! types fails here until `PIVOT_BLESS=1` rewrites them and the diff is reviewed.

use std::path::PathBuf;

fn check(name: &str, schema: schemars::Schema) {
    let schema = serde_json::to_string_pretty(&schema).unwrap() + "\n";
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("docs")
        .join(name);
    if std::env::var_os("PIVOT_BLESS").is_some() {
        std::fs::write(&path, &schema).unwrap();
    }
    let checked_in = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (PIVOT_BLESS=1 writes it)", path.display()));
    assert_eq!(
        schema, checked_in,
        "the types of {name} changed: PIVOT_BLESS=1, review the diff"
    );
}

#[test]
fn the_checked_in_status_schema_is_the_types_schema() {
    check(
        "status.schema.json",
        schemars::schema_for!(super::status::Status),
    );
}

#[test]
fn the_checked_in_progress_schema_is_the_types_schema() {
    check(
        "progress.schema.json",
        schemars::schema_for!(super::progress::Event),
    );
}

#[test]
fn the_checked_in_update_check_schema_is_the_types_schema() {
    check(
        "update-check.schema.json",
        schemars::schema_for!(super::status::UpdateCheck),
    );
}

#[test]
fn the_checked_in_diff_schema_is_the_types_schema() {
    check(
        "diff.schema.json",
        schemars::schema_for!(super::diff::PackageDiff),
    );
}
