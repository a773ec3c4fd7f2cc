//! A bearer-token server speaking the Docker registry token protocol:
//! `GET <realm>?service=S&scope=repository:NAME:pull` with HTTP Basic
//! credentials answers an ES256 JWT that docker-registry's `auth.token`
//! verifies through the `x5c` chain up to `rootcertbundle`.

use crate::auth::parse_basic;
use crate::http1::{self, read_head, split_query};
use crate::jwt::Signer;
use crate::serve::Server;
use crate::tls::TestCa;
use anyhow::{Context, Result};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio_native_tls::TlsAcceptor;

pub const TOKEN_PATH: &str = "/token";
const DEFAULT_SERVICE: &str = "pivot-test-registry";
const ISSUER: &str = "pivot-testkit-token-server";

/// One request to the token endpoint. Passwords are never recorded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenRequest {
    pub path: String,
    /// User named by the Basic credentials, if any were sent.
    pub account: Option<String>,
    /// The credentials matched a configured user.
    pub authorized: bool,
    pub service: Option<String>,
    /// Scopes as requested, e.g. "repository:os/pivot:pull,push".
    pub scopes: Vec<String>,
    /// Scopes granted in the token, with only the allowed actions.
    pub granted: Vec<String>,
    pub status: u16,
}

struct User {
    name: String,
    pass: String,
    actions: Vec<String>,
}

pub struct TokenServerBuilder {
    users: Vec<User>,
    service: String,
    lifetime: Duration,
    tls: Option<(String, String)>,
}

impl TokenServerBuilder {
    /// A user granted whatever of pull, push and delete it asks for.
    pub fn user(self, name: &str, pass: &str) -> Self {
        self.user_with_actions(name, pass, &["pull", "push", "delete"])
    }

    /// A user granted at most `actions` on any repository.
    pub fn user_with_actions(mut self, name: &str, pass: &str, actions: &[&str]) -> Self {
        self.users.push(User {
            name: name.into(),
            pass: pass.into(),
            actions: actions.iter().map(|a| a.to_string()).collect(),
        });
        self
    }

    /// The `service` the registry names and the tokens' audience.
    pub fn service(mut self, service: &str) -> Self {
        self.service = service.into();
        self
    }

    /// Token lifetime (`exp` and `expires_in`); default 300 s.
    pub fn lifetime(mut self, lifetime: Duration) -> Self {
        self.lifetime = lifetime;
        self
    }

    /// Serve the realm over HTTPS with a certificate from `ca` (IP 127.0.0.1).
    pub fn tls(mut self, ca: &TestCa) -> Result<Self> {
        let c = ca.server_cert(&["127.0.0.1", "localhost"])?;
        self.tls = Some((c.cert_pem, c.key_pem));
        Ok(self)
    }

    pub fn start(self) -> Result<TokenServer> {
        // The registry trusts this root; tokens carry the leaf in x5c.
        let root = TestCa::new("pivot testkit token signing root")?;
        let leaf = root.signing_cert("pivot testkit token signer")?;
        let signer = Signer::new(&leaf.cert_pem, &leaf.key_pem)?;
        let acceptor = match &self.tls {
            Some((cert, key)) => {
                let id = native_tls::Identity::from_pkcs8(cert.as_bytes(), key.as_bytes())
                    .context("loading token server TLS identity")?;
                let acceptor = native_tls::TlsAcceptor::new(id).context("TLS acceptor")?;
                Some(TlsAcceptor::from(acceptor))
            }
            None => None,
        };
        let shared = Arc::new(Shared {
            users: self.users,
            service: self.service,
            lifetime: self.lifetime,
            signer,
            log: Mutex::new(Vec::new()),
            serial: AtomicU64::new(0),
        });
        let tls = acceptor.is_some();
        let state = shared.clone();
        let server = Server::spawn("pivot-token-server", move |stream| {
            let state = state.clone();
            let acceptor = acceptor.clone();
            async move {
                let result = match acceptor {
                    Some(a) => match a.accept(stream).await {
                        Ok(s) => handle(s, &state).await,
                        Err(e) => Err(anyhow::Error::new(e).context("TLS handshake")),
                    },
                    None => handle(stream, &state).await,
                };
                if let Err(e) = result {
                    eprintln!("token server: {e:#}");
                }
            }
        })?;
        Ok(TokenServer {
            server,
            shared,
            root,
            tls,
        })
    }
}

pub struct TokenServer {
    server: Server,
    shared: Arc<Shared>,
    root: TestCa,
    tls: bool,
}

impl TokenServer {
    pub fn builder() -> TokenServerBuilder {
        TokenServerBuilder {
            users: Vec::new(),
            service: DEFAULT_SERVICE.into(),
            lifetime: Duration::from_secs(300),
            tls: None,
        }
    }

    /// A plain-HTTP token server with one full-access user.
    pub fn start(user: &str, pass: &str) -> Result<TokenServer> {
        TokenServer::builder().user(user, pass).start()
    }

    pub fn host(&self) -> String {
        self.server.addr().to_string()
    }

    /// The URL registries send clients to (`auth.token.realm`).
    pub fn realm(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}{TOKEN_PATH}", self.host())
    }

    pub fn service(&self) -> &str {
        &self.shared.service
    }

    pub fn issuer(&self) -> &str {
        ISSUER
    }

    /// The CA the token signing certificate chains to (`auth.token.rootcertbundle`).
    pub fn root_cert_pem(&self) -> String {
        self.root.ca_pem()
    }

    /// The first configured user and password (the kit's own pushes use it).
    pub fn first_user(&self) -> Option<(String, String)> {
        let u = self.shared.users.first()?;
        Some((u.name.clone(), u.pass.clone()))
    }

    pub fn requests(&self) -> Vec<TokenRequest> {
        self.shared.log.lock().expect("token log lock").clone()
    }

    pub fn request_count(&self) -> usize {
        self.shared.log.lock().expect("token log lock").len()
    }

    /// Requests answered with a token.
    pub fn issued_count(&self) -> usize {
        self.requests().iter().filter(|r| r.status == 200).count()
    }
}

struct Shared {
    users: Vec<User>,
    service: String,
    lifetime: Duration,
    signer: Signer,
    log: Mutex<Vec<TokenRequest>>,
    serial: AtomicU64,
}

async fn handle<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, state: &Shared) -> Result<()> {
    let head = match read_head(&mut stream).await {
        Ok(Some((head, _))) => head,
        Ok(None) => return Ok(()),
        Err(e) => {
            let reply = http1::response(400, &[], b"not HTTP/1\n", true);
            stream.write_all(&reply).await.ok();
            return Err(e);
        }
    };
    let (path, query) = split_query(head.target());
    let param = |k: &str| -> Vec<String> {
        query
            .iter()
            .filter(|(n, _)| n == k)
            .map(|(_, v)| v.clone())
            .collect()
    };
    let scopes: Vec<String> = param("scope")
        .iter()
        .flat_map(|s| s.split(' ').map(str::to_string).collect::<Vec<_>>())
        .filter(|s| !s.is_empty())
        .collect();
    let creds = head.header("Authorization").and_then(parse_basic);
    let user = creds.as_ref().and_then(|(name, pass)| {
        state
            .users
            .iter()
            .find(|u| &u.name == name && &u.pass == pass)
    });
    let mut record = TokenRequest {
        path: path.clone(),
        account: creds.as_ref().map(|(name, _)| name.clone()),
        authorized: user.is_some(),
        service: param("service").into_iter().next(),
        scopes: scopes.clone(),
        granted: Vec::new(),
        status: 200,
    };
    let reply = if head.method() != "GET" || path != TOKEN_PATH {
        record.status = 404;
        error_response(404, "NOT_FOUND", "no such endpoint")
    } else if let Some(user) = user {
        let access = grant(&scopes, &user.actions);
        record.granted = access
            .iter()
            .map(|a| format!("{}:{}:{}", a.kind, a.name, a.actions.join(",")))
            .collect();
        let token = state.issue(&user.name, &access)?;
        let body = json!({
            "token": token,
            "access_token": token,
            "expires_in": state.lifetime.as_secs(),
        });
        let body = serde_json::to_vec(&body).context("serializing token response")?;
        http1::response(200, &[("Content-Type", "application/json")], &body, true)
    } else {
        record.status = 401;
        error_response(401, "UNAUTHORIZED", "invalid username or password")
    };
    state.log.lock().expect("token log lock").push(record);
    stream.write_all(&reply).await.context("writing reply")?;
    stream.shutdown().await.ok();
    Ok(())
}

fn error_response(status: u16, code: &str, message: &str) -> Vec<u8> {
    let body = json!({ "errors": [{ "code": code, "message": message }] }).to_string();
    http1::response(
        status,
        &[
            ("Content-Type", "application/json"),
            ("WWW-Authenticate", "Basic realm=\"pivot-testkit-token\""),
        ],
        body.as_bytes(),
        true,
    )
}

struct Access {
    kind: String,
    name: String,
    actions: Vec<String>,
}

/// Each requested "type:name:a,b" narrowed to the user's actions; scopes
/// left with no action are omitted.
fn grant(scopes: &[String], allowed: &[String]) -> Vec<Access> {
    scopes
        .iter()
        .filter_map(|scope| {
            let (kind, rest) = scope.split_once(':')?;
            let (name, actions) = rest.rsplit_once(':')?;
            let actions: Vec<String> = actions
                .split(',')
                .filter(|a| allowed.iter().any(|x| x == a))
                .map(str::to_string)
                .collect();
            (!actions.is_empty()).then(|| Access {
                kind: kind.into(),
                name: name.into(),
                actions,
            })
        })
        .collect()
}

impl Shared {
    fn issue(&self, subject: &str, access: &[Access]) -> Result<String> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .context("clock before 1970")?
            .as_secs();
        let serial = self.serial.fetch_add(1, Ordering::Relaxed);
        let access: Vec<Value> = access
            .iter()
            .map(|a| json!({ "type": a.kind, "name": a.name, "actions": a.actions }))
            .collect();
        // distribution 2.8 wants `aud` as a single string.
        let claims = json!({
            "iss": ISSUER,
            "sub": subject,
            "aud": self.service,
            "exp": now + self.lifetime.as_secs(),
            "nbf": now.saturating_sub(10),
            "iat": now,
            "jti": format!("pivot-testkit-{now}-{serial}"),
            "access": access,
        });
        self.signer.sign(&claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_only_allowed_actions() {
        let scopes = vec![
            "repository:os/pivot:pull,push".to_string(),
            "repository:other:push".to_string(),
        ];
        let g = grant(&scopes, &["pull".to_string()]);
        assert_eq!(g.len(), 1);
        assert_eq!(
            (g[0].name.as_str(), &g[0].actions[..]),
            ("os/pivot", &["pull".to_string()][..])
        );
    }
}
