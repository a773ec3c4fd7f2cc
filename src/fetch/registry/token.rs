//! Bearer tokens that expire during a pull. Registries hand out pull tokens for a few minutes
//! (Docker Hub 300 s, quay and OpenShift's registry similar); a pull of a large image outlives
//! them, and a node whose clock is behind (first boot, before time sync) cannot tell when one
//! expires. So a request the registry answers 401 while a bearer token is in use gets a new
//! token for its scope and is sent once more; a second 401 means the credentials (or their
//! absence) do not allow the pull, and the error says so instead of retrying.

use std::future::Future;

use oci_client::errors::OciDistributionError;
use oci_client::{Reference, RegistryOperation};

use super::Registry;

impl Registry {
    /// The bearer token in use for manifests: `None` before the first request, `Some(None)`
    /// when the registry wants none (anonymous or Basic).
    pub(super) fn token(&self) -> Option<Option<String>> {
        self.token.lock().expect("token lock").clone()
    }

    /// Asks the registry's token service for a pull token for `reference`'s repository (oci-client
    /// keeps it for its blob requests too). A refused request means trying without, as
    /// oci-client does: the registry's answer is then what gets reported. A token service that
    /// is down or rate-limits (5xx, 408, 429, no connection) is an error to retry, as the
    /// registry itself would be: trying without a token would only be refused. So is the
    /// registry's `/v2/` ping that oci-client sends first to read the challenge: answered 429
    /// or 503, it is asked again no sooner than its `Retry-After`.
    pub(super) async fn new_token(
        &self,
        reference: &Reference,
    ) -> Result<Option<String>, OciDistributionError> {
        let token = match self
            .client
            .auth(reference, &self.auth, RegistryOperation::Pull)
            .await
        {
            Ok(token) => token,
            Err(e) if crate::fetch::retry::is_transient(&e) => return Err(e),
            Err(e) => {
                tracing::debug!("getting a pull token: {}", crate::fetch::retry::describe(&e));
                None
            }
        };
        *self.token.lock().expect("token lock") = Some(token.clone());
        Ok(token)
    }

    /// Runs `request`; if the registry refuses it (401) while a bearer token is in use, gets a
    /// new token and runs it once more.
    pub(super) async fn renewing<T, F, Fut>(
        &self,
        reference: &Reference,
        request: F,
    ) -> Result<T, OciDistributionError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, OciDistributionError>>,
    {
        match request().await {
            Err(OciDistributionError::UnauthorizedError { url })
                if matches!(self.token(), Some(Some(_))) =>
            {
                tracing::info!(
                    registry = %self.image.registry,
                    "the registry refused the pull token (expired?): getting a new one"
                );
                if self.new_token(reference).await?.is_none() {
                    return Err(self.refused_again(&url));
                }
                match request().await {
                    Err(OciDistributionError::UnauthorizedError { url }) => {
                        Err(self.refused_again(&url))
                    }
                    other => other,
                }
            }
            other => other,
        }
    }

    /// The error of a request refused with a freshly issued token: the credentials' fault.
    fn refused_again(&self, url: &str) -> OciDistributionError {
        let whose = match &self.auth_source {
            Some(path) => format!("the credentials from {}", path.display()),
            None => "anonymous pulls (no auth file has credentials for it)".to_string(),
        };
        OciDistributionError::AuthenticationFailure(format!(
            "Not authorized: url {url}: the registry refused a newly issued token as well, so {whose} may not pull {}",
            self.image.name()
        ))
    }
}
