//! Opening the Harness API WebSocket (v5 §1): the URL, the upgrade headers (`Authorization:
//! Bearer <host token>`, `Nylorun-Harness-Api: 1`), the 64 MiB frame caps, the handshake
//! timeout, and what each refusal status means for the person reading the log. A `wss` URL is
//! opened with the same TLS configuration as join and the gates, so a core behind a private
//! CA that joins also connects.
//!
//! Non-goals: what flows over the socket once open ([`crate::nylorun::link::channel`]).

use std::sync::Arc;
use std::time::Duration;

use reqwest::Url;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;
use tokio_tungstenite::{Connector, MaybeTlsStream, WebSocketStream};

use crate::nylorun::link::protocol::{API_HEADER, HostToken, MAX_PAYLOAD, TRANSPORT_VERSION};

/// The connected WebSocket.
pub type WsStream = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// Timing of one connection.
#[derive(Clone, Debug)]
pub struct ChannelConfig {
    /// Drop the connection after this long without a message, ping or pong.
    pub silence_timeout: Duration,
    /// The upgrade must finish within this (the reference harness: 10 s).
    pub handshake_timeout: Duration,
    /// One frame must be written within this, or the connection is dropped.
    pub write_timeout: Duration,
}

impl Default for ChannelConfig {
    fn default() -> Self {
        ChannelConfig {
            silence_timeout: Duration::from_secs(90),
            handshake_timeout: Duration::from_secs(10),
            write_timeout: Duration::from_secs(30),
        }
    }
}

/// Why the WebSocket could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("core refused the Harness API connection: HTTP {status} ({meaning})")]
    Refused { status: u16, meaning: &'static str },
    #[error("the Harness API handshake did not finish within {0:?}")]
    Timeout(Duration),
    #[error("could not reach the Harness API at {url}: {message}")]
    Transport { url: String, message: String },
}

impl ConnectError {
    /// What a refusal status means (v5 §1, v2 notes §1.1).
    fn meaning(status: u16) -> &'static str {
        match status {
            401 => "the host token was refused; joining again",
            404 => "wrong path: NYLORUN_HARNESS_URL may not point at core's harness listener",
            421 => "core does not allow this Host",
            426 => "core wants another transport version (Nylorun-Harness-Api)",
            503 => "the Tenant is closed or core is stopping",
            _ => "unexpected answer to the upgrade",
        }
    }
}

/// Opens the WebSocket with the host token as bearer; a `wss` URL over `tls`, podhost's one
/// client configuration ([`crate::floor::tls`]).
pub async fn connect(
    url: &Url,
    token: &HostToken,
    cfg: &ChannelConfig,
    tls: &Arc<rustls::ClientConfig>,
) -> Result<WsStream, ConnectError> {
    let transport = |message: String| ConnectError::Transport {
        url: url.to_string(),
        message,
    };
    let mut request = url
        .as_str()
        .into_client_request()
        .map_err(|e| transport(e.to_string()))?;
    let bearer = HeaderValue::from_str(&format!("Bearer {}", token.expose()))
        .map_err(|_| transport("the host token cannot be sent as a header".to_owned()))?;
    request.headers_mut().insert("Authorization", bearer);
    request
        .headers_mut()
        .insert(API_HEADER, HeaderValue::from_static(TRANSPORT_VERSION));
    let ws_config = WebSocketConfig::default()
        .max_message_size(Some(MAX_PAYLOAD))
        .max_frame_size(Some(MAX_PAYLOAD));
    let attempt = tokio_tungstenite::connect_async_tls_with_config(
        request,
        Some(ws_config),
        true,
        Some(Connector::Rustls(tls.clone())),
    );
    match tokio::time::timeout(cfg.handshake_timeout, attempt).await {
        Err(_) => Err(ConnectError::Timeout(cfg.handshake_timeout)),
        Ok(Ok((ws, _response))) => Ok(ws),
        Ok(Err(tungstenite::Error::Http(response))) => {
            let status = response.status().as_u16();
            Err(ConnectError::Refused {
                status,
                meaning: ConnectError::meaning(status),
            })
        }
        Ok(Err(e)) => Err(transport(e.to_string())),
    }
}
