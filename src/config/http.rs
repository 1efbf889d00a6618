//! The settings of the hardened HTTP listener that `podhost serve` and `podhost mcp --listen`
//! share, into an [`HttpLimits`].

use std::time::Duration;

use clap::Args;

use crate::floor::http::HttpLimits;

/// The listener's timeouts and caps (`PODHOST_HTTP_*`), the same for every HTTP front.
#[derive(Clone, Debug, Args)]
#[command(next_help_heading = "HTTP listener")]
pub struct HttpArgs {
    /// Seconds a connection may take to send a request's headers (from its accept, or from its
    /// first byte after the previous response); past it, the connection is closed.
    #[arg(long, env = "PODHOST_HTTP_HEADER_TIMEOUT_SECS", default_value_t = 10,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub http_header_timeout_secs: u64,
    /// Seconds a request's body may take to arrive; past it, the connection is closed.
    #[arg(long, env = "PODHOST_HTTP_BODY_TIMEOUT_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub http_body_timeout_secs: u64,
    /// Seconds a kept-alive connection may stay silent between requests, and a client may leave
    /// its response unread.
    #[arg(long, env = "PODHOST_HTTP_IDLE_TIMEOUT_SECS", default_value_t = 60,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub http_idle_timeout_secs: u64,
    /// Most connections open at once; at the cap, the oldest connection not inside a request is
    /// closed to make room, else the one whose request body has stalled longest.
    #[arg(long, env = "PODHOST_HTTP_MAX_CONNECTIONS", default_value_t = 4096,
          value_parser = clap::value_parser!(u64).range(16..=1_000_000))]
    pub http_max_connections: u64,
    /// MiB of request bodies held at once across all connections (bodies are read as they
    /// arrive); a body whose next bytes would pass it has its connection closed.
    #[arg(long, env = "PODHOST_HTTP_MAX_BODY_HELD_MB", default_value_t = 64,
          value_parser = clap::value_parser!(u64).range(16..=1_048_576))]
    pub http_max_body_held_mb: u64,
}

impl HttpArgs {
    /// The plain limits; pure.
    pub fn limits(&self) -> HttpLimits {
        HttpLimits {
            header_timeout: Duration::from_secs(self.http_header_timeout_secs),
            body_timeout: Duration::from_secs(self.http_body_timeout_secs),
            idle_timeout: Duration::from_secs(self.http_idle_timeout_secs),
            max_connections: self.http_max_connections as usize,
            max_body_bytes_held: (self.http_max_body_held_mb << 20) as usize,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use pretty_assertions::assert_eq;

    #[derive(Parser)]
    struct Wrap {
        #[command(flatten)]
        http: HttpArgs,
    }

    #[test]
    fn the_defaults_are_the_listeners() {
        let w = Wrap::try_parse_from(["x"]).unwrap();
        assert_eq!(w.http.limits(), HttpLimits::default());
        let w = Wrap::try_parse_from(["x", "--http-max-body-held-mb", "16"]).unwrap();
        assert_eq!(w.http.limits().max_body_bytes_held, 16 << 20);
        assert!(Wrap::try_parse_from(["x", "--http-max-body-held-mb", "8"]).is_err());
    }
}
