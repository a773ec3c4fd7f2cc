//! Test kit for `pivot`, built from real parts: fixture trees committed with
//! libostree, a real `docker-registry` on loopback, legacy oscontainers pushed
//! to it, and throwaway OSTree sysroots deployed by the ostree CLI.
//! For auth, TLS and fault tests: a CA made at test time, htpasswd and token
//! auth on the registry, a bearer-token server and a fault-injecting proxy.
//! For hostile images: raw tar layers, manifests and configs written byte by byte.
//! For crash and disk-space tests: size-limited tmpfs mounts.
//! For ostree-native images: ostree-rs-ext's encapsulation (tests/ext-fixtures) and skopeo.

mod auth;
mod commit;
mod cosign;
mod ext_fixtures;
mod fault;
mod fault_proxy;
mod fleet_lock;
mod http1;
mod jwt;
mod layer;
mod oscontainer;
mod push;
mod raw;
mod registry;
mod registry_config;
mod serve;
pub use serve::Resumer;
mod sysroot;
mod tinyproxy;
mod tls;
mod tmpfs;
mod token_server;
mod tree;

pub use auth::{basic_auth, htpasswd_line, write_auth_json};
pub use commit::{commit_tree, sign_commit, CommitSigner, COMMIT_TIME};
pub use cosign::{
    attach_annotated, attach_cosign_signature, attach_signatures, cosign_payload, ec_key_pair,
    genpkey_pair, openssl_chain, openssl_sign, openssl_sign_any, run_openssl,
    Chain as OpensslChain, P256, SIGSTORE_KEY_TYPES,
};
pub use ext_fixtures::{encapsulate, ext_fixtures_tool, ext_judge, skopeo_push};
pub use fault_proxy::{Fault, FaultKind, FaultProxy, ProxiedRequest};
pub use fleet_lock::{
    zincati_id, Flavour as FleetLockFlavour, FleetLockServer, Gateway as FleetLockGateway,
    LockRequest, Node as ClusterNode,
};
pub use oscontainer::{
    push_oscontainer, CommitLabel, Compression, ImageSpec, ManifestFormat, PushedImage,
    COMMIT_LABEL, DECOY_COMMIT,
};
pub use push::sha256_digest;
pub use raw::{PushedRaw, RawEntry, RawImage, RawKind, RawLayer, RawTar, RepoTar};
pub use registry::{AccessLogEntry, Registry};
pub use registry_config::RegistryBuilder;
pub use sysroot::{pivot_test_env, TestSysroot};
pub use tinyproxy::Tinyproxy;
pub use tls::{CertKey, TestCa};
pub use tmpfs::Tmpfs;
pub use token_server::{TokenRequest, TokenServer, TokenServerBuilder, TOKEN_PATH};
pub use tree::{fixtures_dir, Entry, Tree};

/// containers/image's published signature fixtures, where `.ci/signature-fixtures` unpacks
/// them (`PIVOT_SIGNATURE_FIXTURES` names its destination instead); a test that needs them and
/// finds none fails, saying how to get them.
pub fn containers_image_fixtures() -> std::path::PathBuf {
    let dest = std::env::var_os("PIVOT_SIGNATURE_FIXTURES")
        .unwrap_or_else(|| "/var/cache/pivot-tests/containers-image".into());
    let dir = std::path::PathBuf::from(dest).join("fixtures");
    assert!(
        dir.join("policy.json").is_file(),
        "containers/image's signature fixtures are missing from {}: run .ci/signature-fixtures",
        dir.display()
    );
    dir
}
