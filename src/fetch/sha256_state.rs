//! A SHA-256 whose state can be saved and restored: a layer download resumed from a checkpoint
//! goes on hashing from where the killed run was, without the bytes before it (which are no
//! longer kept). Built on `sha2`'s compression function, so it hashes as fast as `sha2::Sha256`.

use sha2::digest::generic_array::GenericArray;

const INITIAL: [u32; 8] = [
    0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
];

/// The running state: the chaining value, the bytes of the block not yet complete and the
/// length hashed so far.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Sha256State {
    h: [u32; 8],
    #[serde(with = "crate::fetch::sha256_state::hex_bytes")]
    tail: Vec<u8>,
    len: u64,
}

impl Default for Sha256State {
    fn default() -> Self {
        Sha256State {
            h: INITIAL,
            tail: Vec::with_capacity(64),
            len: 0,
        }
    }
}

impl Sha256State {
    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if !self.tail.is_empty() {
            let take = (64 - self.tail.len()).min(data.len());
            self.tail.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.tail.len() < 64 {
                return;
            }
            let block = GenericArray::clone_from_slice(&self.tail);
            sha2::compress256(&mut self.h, &[block]);
            self.tail.clear();
        }
        let whole = data.len() / 64 * 64;
        let (blocks, rest) = data.split_at(whole);
        for block in blocks.chunks_exact(64) {
            sha2::compress256(
                &mut self.h,
                std::slice::from_ref(GenericArray::from_slice(block)),
            );
        }
        self.tail.extend_from_slice(rest);
    }

    /// The digest of everything hashed, as lowercase hex.
    pub fn hex(&self) -> String {
        let mut last = self.clone();
        let bits = self.len.wrapping_mul(8);
        let mut pad = vec![0x80u8];
        pad.resize((64 + 56 - (self.tail.len() + 1) % 64) % 64 + 1, 0);
        pad.extend_from_slice(&bits.to_be_bytes());
        last.update(&pad);
        debug_assert!(last.tail.is_empty());
        last.h.iter().map(|w| format!("{w:08x}")).collect()
    }

    /// Bytes hashed so far.
    #[cfg(test)]
    pub fn hashed(&self) -> u64 {
        self.len
    }

    /// A saved state must be one this type could have reached.
    pub fn is_sound(&self) -> bool {
        self.tail.len() < 64 && self.len % 64 == self.tail.len() as u64
    }
}

/// Bytes as lowercase hex in JSON.
pub(crate) mod hex_bytes {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&hex::encode(bytes))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        hex::decode(String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    #[test]
    fn hashes_like_sha2_whatever_the_pieces_and_across_a_save() {
        let data: Vec<u8> = (0..5000u32).map(|i| (i * 7 + i / 13) as u8).collect();
        for len in [0, 1, 55, 56, 63, 64, 65, 119, 128, 1000, 5000] {
            let data = &data[..len];
            let expected = hex::encode(Sha256::digest(data));
            for cut in [0, 1, 3, 63, 64, 100, 999] {
                let cut = cut.min(len);
                let mut state = Sha256State::default();
                state.update(&data[..cut]);
                let saved = serde_json::to_string(&state).unwrap();
                let mut state: Sha256State = serde_json::from_str(&saved).unwrap();
                assert!(state.is_sound());
                for piece in data[cut..].chunks(37) {
                    state.update(piece);
                }
                assert_eq!(state.hex(), expected, "{len} bytes cut at {cut}");
                assert_eq!(state.hashed(), len as u64);
            }
        }
    }
}
