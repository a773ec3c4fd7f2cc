//! Where an image comes from: a registry (mirrors first, as registries.conf says) or an OCI
//! layout on this machine. Both give a manifest checked against its digest, a checked config and
//! layer blobs that [`crate::fetch::blob_reader`] hashes as they are read.

use std::sync::Arc;

use anyhow::{Context, Result};
use oci_client::manifest::OciDescriptor;

use crate::fetch::config::registries::RegistriesConf;
use crate::fetch::layout::Layout;
use crate::fetch::reference::{ImageRef, Transport};
use crate::fetch::registry::{self, Access, Registry, ResolvedManifest};

#[derive(Clone)]
pub enum Source {
    Registry(Box<Registry>),
    Layout(Arc<Layout>),
}

/// Opens the image's source and resolves its manifest.
pub async fn open(image: &ImageRef, access: &Access) -> Result<(Source, ResolvedManifest)> {
    if image.transport == Transport::Registry {
        let conf = RegistriesConf::load_default()?;
        let (registry, resolved) = registry::open(image, &conf, access).await?;
        return Ok((Source::Registry(Box::new(registry)), resolved));
    }
    let image = image.clone();
    tokio::task::spawn_blocking(move || {
        let layout = Layout::open(&image)?;
        let resolved = layout.resolve(&image)?;
        Ok((Source::Layout(Arc::new(layout)), resolved))
    })
    .await?
}

impl Source {
    /// The registry, for an image that comes from one.
    pub fn registry(&self) -> Option<&Registry> {
        match self {
            Source::Registry(registry) => Some(registry),
            Source::Layout(_) => None,
        }
    }

    /// A small JSON blob (the image config), checked against its descriptor.
    pub async fn fetch_json_blob(&self, desc: &OciDescriptor) -> Result<Vec<u8>> {
        match self {
            Source::Registry(registry) => registry.fetch_json_blob(desc).await,
            Source::Layout(layout) => {
                let (layout, desc) = (layout.clone(), desc.clone());
                tokio::task::spawn_blocking(move || {
                    layout
                        .read_json_blob(&desc)
                        .with_context(|| format!("reading blob {}", desc.digest))
                })
                .await?
            }
        }
    }

    /// Downloads are spooled for a later run to resume; a layout's blobs are on disk already.
    pub fn is_remote(&self) -> bool {
        matches!(self, Source::Registry(_))
    }
}
