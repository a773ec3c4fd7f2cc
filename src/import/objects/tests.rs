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
fn object_keys_are_written_as_loose_names_and_read_back() {
    let checksum = "ab".to_string() + &"c".repeat(62);
    let mut tally = Tally {
        names: Some(Vec::new()),
        ..Tally::default()
    };
    tally.count(&checksum, "filez", Outcome::Written);
    tally.count(&checksum, "dirtree", Outcome::Skipped);
    tally.count(&checksum, "sig", Outcome::Ignored);
    let keys = tally.names.unwrap();
    assert_eq!((tally.written, tally.skipped), (1, 1));
    let json = serde_json::to_string(&keys).unwrap();
    assert_eq!(
        json,
        format!("[\"{checksum}.file\",\"{checksum}.dirtree\"]")
    );
    assert_eq!(serde_json::from_str::<Vec<ObjectKey>>(&json).unwrap(), keys);
    assert_eq!(keys[0].kind(), ObjectType::File);
    for bad in [
        "\"abc.file\"",
        &format!("\"{checksum}.sig\""),
        &format!("\"{}.file\"", checksum.to_uppercase()),
    ] {
        assert!(serde_json::from_str::<ObjectKey>(bad).is_err(), "{bad}");
    }
}
