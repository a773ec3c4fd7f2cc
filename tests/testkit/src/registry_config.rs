//! Options of a test registry and the distribution 2.8 config.yml they make:
//! htpasswd or token auth, TLS with optional client-certificate checks, and
//! own, shared or copied storage.

use crate::auth::htpasswd_line;
use crate::registry::Registry;
use crate::tls::{write, TestCa};
use crate::token_server::TokenServer;
use anyhow::{bail, Context, Result};
use std::fs;
use std::path::{Path, PathBuf};

#[derive(Clone, Debug, Default)]
pub(crate) struct Options {
    pub htpasswd: Vec<(String, String)>,
    pub tls: Option<TlsFiles>,
    pub client_ca_pem: Option<String>,
    pub token: Option<TokenAuth>,
    pub storage: Storage,
}

#[derive(Clone, Debug)]
pub(crate) struct TlsFiles {
    pub cert_pem: String,
    pub key_pem: String,
    pub ca_pem: String,
}

#[derive(Clone, Debug)]
pub(crate) struct TokenAuth {
    pub realm: String,
    pub service: String,
    pub issuer: String,
    pub root_pem: String,
    pub user: Option<(String, String)>,
}

#[derive(Clone, Debug, Default)]
pub(crate) enum Storage {
    /// A fresh directory in the registry's own temp dir.
    #[default]
    Own,
    /// Another registry's storage directory, served by both processes.
    Shared(PathBuf),
    /// A copy, taken at start, of another registry's storage.
    CopiedFrom(PathBuf),
}

/// Builds a [`Registry`] with auth, TLS and storage options.
#[derive(Default)]
pub struct RegistryBuilder {
    opts: Options,
}

impl RegistryBuilder {
    /// Requires HTTP Basic auth (`auth.htpasswd`); repeat for more users.
    /// The first user is the one the kit's own pushes use.
    pub fn htpasswd(mut self, user: &str, pass: &str) -> Self {
        self.opts.htpasswd.push((user.into(), pass.into()));
        self
    }

    /// Serves HTTPS with a certificate from `ca` for IP 127.0.0.1 and localhost.
    pub fn tls(mut self, ca: &TestCa) -> Result<Self> {
        let cert = ca.server_cert(&["127.0.0.1", "localhost"])?;
        self.opts.tls = Some(TlsFiles {
            cert_pem: cert.cert_pem,
            key_pem: cert.key_pem,
            ca_pem: ca.ca_pem(),
        });
        Ok(self)
    }

    /// Requires a client certificate issued by `ca` (`http.tls.clientcas`).
    pub fn client_ca(mut self, ca: &TestCa) -> Self {
        self.opts.client_ca_pem = Some(ca.ca_pem());
        self
    }

    /// Requires bearer tokens from `server` (`auth.token`).
    pub fn token_auth(mut self, server: &TokenServer) -> Self {
        self.opts.token = Some(TokenAuth {
            realm: server.realm(),
            service: server.service().into(),
            issuer: server.issuer().into(),
            root_pem: server.root_cert_pem(),
            user: server.first_user(),
        });
        self
    }

    /// [`Self::token_auth`], with clients sent to the token service through `proxy_host`
    /// ("127.0.0.1:PORT" of a proxy in front of it, e.g. a fault proxy).
    pub fn token_auth_through(self, server: &TokenServer, proxy_host: &str) -> Self {
        let mut this = self.token_auth(server);
        if let Some(token) = this.opts.token.as_mut() {
            token.realm = token.realm.replacen(&server.host(), proxy_host, 1);
        }
        this
    }

    /// Serves the same storage directory as `other` (which must outlive this
    /// registry): a push to either is visible on both.
    pub fn shared_storage(mut self, other: &Registry) -> Self {
        self.opts.storage = Storage::Shared(other.storage_dir());
        self
    }

    /// Starts from a copy of `other`'s storage; later pushes stay apart.
    pub fn storage_copied_from(mut self, other: &Registry) -> Self {
        self.opts.storage = Storage::CopiedFrom(other.storage_dir());
        self
    }

    pub fn start(self) -> Result<Registry> {
        let o = &self.opts;
        if !o.htpasswd.is_empty() && o.token.is_some() {
            bail!("a registry takes either htpasswd or token auth, not both");
        }
        if o.client_ca_pem.is_some() && o.tls.is_none() {
            bail!("client_ca needs tls");
        }
        Registry::start_with(self.opts)
    }
}

impl Options {
    /// Writes config.yml and the files it names into `root`.
    pub fn write_config(&self, root: &Path, storage: &Path, addr: &str) -> Result<PathBuf> {
        // A fixed http.secret only silences the "no secret" warning.
        let mut text = format!(
            "version: 0.1\nlog:\n  level: info\n  accesslog:\n    disabled: false\n\
             storage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\n  \
             redirect:\n    disable: true\n\
             http:\n  addr: {addr}\n  secret: pivot-testkit\n",
            storage.display(),
        );
        if let Some(tls) = &self.tls {
            let cert = root.join("server.crt");
            let key = root.join("server.key");
            write(&cert, &tls.cert_pem)?;
            write(&key, &tls.key_pem)?;
            text += &format!(
                "  tls:\n    certificate: {}\n    key: {}\n",
                cert.display(),
                key.display()
            );
            if let Some(ca) = &self.client_ca_pem {
                let path = root.join("client-ca.crt");
                write(&path, ca)?;
                text += &format!("    clientcas:\n      - {}\n", path.display());
            }
        }
        if !self.htpasswd.is_empty() {
            let path = root.join("htpasswd");
            let mut lines = String::new();
            for (user, pass) in &self.htpasswd {
                lines += &htpasswd_line(user, pass)?;
                lines.push('\n');
            }
            write(&path, &lines)?;
            text += &format!(
                "auth:\n  htpasswd:\n    realm: pivot-testkit\n    path: {}\n",
                path.display()
            );
        }
        if let Some(token) = &self.token {
            let bundle = root.join("token-root.crt");
            write(&bundle, &token.root_pem)?;
            text += &format!(
                "auth:\n  token:\n    realm: {}\n    service: {}\n    issuer: {}\n    rootcertbundle: {}\n",
                token.realm,
                token.service,
                token.issuer,
                bundle.display()
            );
        }
        let path = root.join("config.yml");
        write(&path, &text)?;
        Ok(path)
    }

    /// Credentials the kit's own pushes send, if the registry needs any.
    pub fn push_credentials(&self) -> Option<(String, String)> {
        self.htpasswd
            .first()
            .cloned()
            .or_else(|| self.token.as_ref().and_then(|t| t.user.clone()))
    }
}

pub(crate) fn copy_dir(from: &Path, to: &Path) -> Result<()> {
    fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else {
            fs::copy(entry.path(), &target)
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    Ok(())
}
