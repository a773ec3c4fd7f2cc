//! The node's id towards a FleetLock server: an application-specific machine ID, derived from
//! `/etc/machine-id` as zincati derives its own (systemd's `sd_id128_get_machine_app_specific`),
//! with pivot's application ID. Stable across boots and reinstalls that keep the machine ID,
//! and it does not reveal the machine ID itself.

use std::path::Path;

use anyhow::{ensure, Context, Result};
use openssl::hash::MessageDigest;
use openssl::pkey::PKey;
use openssl::sign::Signer;

/// pivot's application ID (a random UUID, fixed forever: changing it changes every node's id).
pub const APP_ID: &str = "6f7901ecce5d4a068ea1f7f9a3c7323a";

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
        assert_ne!(id, app_specific(machine, "de35106b6ec24688b63afddaa156679b").unwrap());
        assert!(app_specific("not-an-id", APP_ID).is_err());
    }
}
