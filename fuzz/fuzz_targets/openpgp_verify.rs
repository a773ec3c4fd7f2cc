//! Simple-signing messages (OpenPGP): no bytes panic the verification against
//! containers/image's test keyring (`signature/fixtures/public-key.gpg`), and a message that
//! verifies was signed by its key.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use pivot::trust::simple_signing::{verify, Keyring};

const KEYRING: &str = "-----BEGIN PGP PUBLIC KEY BLOCK-----

mQGNBGhZqH0BDAC+a6piJ08wd699XSUs1s1Fkoeue1qfjheI9UhCE/YDT7ZOcnIM
1hZH7E7ixaOdCPuHwqbhF9CXy6ger1vvA/GKiA6vVzmOcoBHr/LvFXfwjtyziBNM
7bC9Bd7RFf3Y0Y00NqaF9RAXA2e+EQf2/0XWugAQrSI7WlzglKlNN48+AOWMnPO+
Sg64CxqR9d2gkPdMk041kTWRXxIoP80p+XiPas1GV8e0w//TXJpYpN6vTVwfNoms
48NP615XPdLwlp85WTTtLHAAlL1tLKxX533h1HDZrVKhDmV9ITyNseVIGIY3NBnl
ilvIti2jYZmTsWicWmvSOuRl5F3ULyKRVEOS8BXyLWaCpG2XrhzSib32ekXu8kkM
jhe3k5vJfvIYX6RDHOJvbhrEG8XYyMtRAAn5IxUxUtzg/0KJFOfFqDOYbpFQOIxV
wd2OD4OiNgwzTfIsuOHcjEFyB10RyzCpNVcVzSYClBBQCp5U++B71LqhumNsVokW
dtuXXsVwCbvVODEAEQEAAbQSc2tvcGVvIHRlc3Rpbmcga2V5iQHRBBMBCAA7FiEE
CM0m5Ebi6VJJt6QF6TL0SyPo3UMFAmhZqH0CGwMFCwkIBwICIgIGFQoJCAsCBBYC
AwECHgcCF4AACgkQ6TL0SyPo3UMdVgv/QgMundL6ut4ZiyFMLpS8iBi+TMqZdHHl
M1zfTSLf4t0FLdPX53jYwUd74jVxnyjebmiWbE85vyl3zfW27J2et9S/LbpkpFpg
YcuRaoSBHZoWVnammtWlc4h2+YiY+nfpTAYa7yOw6uDQKx3eyOsjCfEur8SHv4Gy
yxCZN3pmLACu1v1RndCd7c/08kC4HChdJoIVOO/6tmIbrNq4Cii3vCzwMe4/lbSL
zouNkLyHQ55MJSGCqDmxBvCVq8Wutchm9Jk03GKXpOGntrM/i/qz8gBgOfFsvWKy
2bZxXiw2eXFanB7omfcD3gLD84fByxHuLNPxtwa3ncr1MZ0B7aQKNx1BLJL+OTRy
BCxJtMLvnleyNRtW6uDNs2KIcLEIP7FaqtQh7/WB8BEBJ9dgmGfo2R1D/R7OsN0w
qcNGApG2yaRdzJmT/IhzBoB/Kds9Yu4cY0dHSbhR0/HnsxhSP+s8vHjsBfk6pukD
U4uW+8uSRqY/b4B5moC/JkYg5ShNTXiTuQGNBGhZqH0BDADSu4n0WTQ2LWm2m4DV
pybxCumh2PFcPH7r43rDpMhDZgUmsR1rqfgc/hQ2XU3mlKWG4gcNNoK2SWYmgCIz
i9aPNr2EYSh8XoGnCEfsr2w4foHicaHCKhG6VuNX/loL+6e8A5KoS/kP3lukJuRf
l+z1GyIgWX+h7LVXvMTS6z36P12fm8t6Lb912ES0dniPZgZdU64U3CWXjc7ijV/S
8YZoNPKzcG+yd52YQgJktpAPA4LY1XaxmTZxAVUv+4LVqS0sMhx+OMoLati0fF7o
xprzzMaoEqpJlm7gubU7TlgaHddWphMp2TuEUCAkuMZNHXuxe0/riwMANYINF4hQ
YkGdzCFRda9cLqt0jYVjsHkm73l/H1a/zEdfWhSto1Xqbdw4WqiONAD6UMqOgM9z
Dm8y5qVwr3OMVhyopTT3g9/EnOIXNIEApJ7uDCrLrlBTRKWCSLmg5HJ63EN6ZmaJ
GVow2RjSoLpXBhLKQ+adbxseX/uXaLbBVn+Vq9rSSi5Mk7cAEQEAAYkBtgQYAQgA
IBYhBAjNJuRG4ulSSbekBeky9Esj6N1DBQJoWah9AhsMAAoJEOky9Esj6N1DCVkL
/3i8/eG14C+YKopw2xyRGpsDlPSpl7V2yc8a3axN8tFfS/Ux7NRBhL900pa45d0Y
6yuXtmPfnlQZfXKYJdjA1DiwPcOjEzYduMR1NSeNPA4beuAy9SQmXryc94k2r1XO
uf4+M3i1p8jPf4aKo86NuoML/kwJRxrizyXn3AcE9sTtOIyH9yqDzsyVLkdWC/WZ
A1A8AgqHT1TIYWSqELY/46jzeg/I4k1+jhVjxZ0bY3r7qcxg3R8UtEh1CfIILQ6v
vhyda8wYV9Cwbb5icGCvG4yfRurFVSAkwyuDZuErSv/pxPwPR5mfKlIrNa8xhjaV
BRSGAD/CnbRl2oIgZxBxBoPYozFWiOv3SlpkIiybRHt8nwSCZmJ96o4o+IyOue9g
xkZgXLUTClzVtlZIiOCioVshlxkyjgyjpRo0ykbJMZtrAVMcJCDc3M6nIy3Itc79
XG4cBOqr22TkiSyRcf1Q/+Sor/T+YYegL92U33DmGIZ33jqvPCfRvXlUSGUaZVYg
QQ==
=5rnd
-----END PGP PUBLIC KEY BLOCK-----
";
/// Its key (containers/image's `TestKeyFingerprint`).
const FINGERPRINT: &str = "08CD26E446E2E95249B7A405E932F44B23E8DD43";

fn keyring() -> &'static Keyring {
    static KEYRING_PARSED: OnceLock<Keyring> = OnceLock::new();
    KEYRING_PARSED.get_or_init(|| Keyring::parse(KEYRING.as_bytes()).unwrap())
}

fuzz_target!(|data: &[u8]| {
    if let Ok((_, fingerprint)) = verify(data, keyring()) {
        assert_eq!(fingerprint, FINGERPRINT);
    }
});
