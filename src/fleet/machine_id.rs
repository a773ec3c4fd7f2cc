//! The node's id towards a FleetLock server: zincati's own — the application-specific machine ID
//! systemd's `sd_id128_get_machine_app_specific` derives from `/etc/machine-id` with *zincati's*
//! application ID. A node is then the same client whether pivot or zincati asks (a slot pivot
//! took is released by zincati, and the other way round), and poseidon/fleetlock, which finds
//! the Kubernetes node to drain by computing exactly this id from the machine ID each node
//! reports (its `internal/nodes.go`), can find it: with an id of pivot's own, no node matched,
//! the drain did nothing and `steady-state` failed for good. Stable across boots and reinstalls
//! that keep the machine ID, and it does not reveal the machine ID itself.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;

/// zincati's application ID (its `identity` module), which FleetLock servers expect.
pub const APP_ID: &str = "de35106b6ec24688b63afddaa156679b";

/// The app-specific id of the machine whose `/etc` is `etc`.
pub fn of_etc(etc: &Path) -> Result<String> {
    let path = etc.join("machine-id");
    let text = std::fs::read_to_string(&path)
        .with_context(|| format!("reading {} (the FleetLock id is derived from it)", path.display()))?;
    app_specific(text.trim(), APP_ID).with_context(|| format!("in {}", path.display()))
}

/// `machine_id` (32 hex digits) made specific to `app_id`: HMAC-SHA256 keyed by the machine ID
/// over the app ID, the first 16 bytes, marked as a version-4 UUID.
pub fn app_specific(machine_id: &str, app_id: &str) -> Result<String> {
    let machine = id128(machine_id).context("not a machine ID")?;
    let app = id128(app_id).context("not an application ID")?;
    let key = PKey::hmac(&machine)?;
    let mut signer = Signer::new(MessageDigest::sha256(), &key)?;
    signer.update(&app)?;
    let mac = signer.sign_to_vec()?;
    let mut id = [0u8; 16];
    id.copy_from_slice(&mac[..16]);
    id[6] = (id[6] & 0x0f) | 0x40;
    id[8] = (id[8] & 0x3f) | 0x80;
    Ok(hex::encode(id))
}

fn id128(text: &str) -> Result<Vec<u8>> {
    ensure!(
        text.len() == 32 && text.bytes().all(|b| b.is_ascii_hexdigit()),
        "{text:?} is not 32 hexadecimal digits"
    );
    Ok(hex::decode(text)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_id_is_a_version_4_uuid_specific_to_machine_and_app() {
        let machine = "3d1219c7c4c5404aaa1f6d2a48adfda4";
        let id = app_specific(machine, APP_ID).unwrap();
        assert_eq!(id.len(), 32);
        assert_eq!(&id[12..13], "4");
        assert!("89ab".contains(&id[16..17]), "{id}");
        // Another application's id of the same machine differs.
        assert_ne!(id, app_specific(machine, "6f7901ecce5d4a068ea1f7f9a3c7323a").unwrap());
        assert_ne!(id, app_specific("3d1219c7c4c5404aaa1f6d2a48adfda5", APP_ID).unwrap());
        assert!(app_specific("not-an-id", APP_ID).is_err());
    }
}
