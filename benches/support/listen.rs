//! The address `podhost serve` listens on, read from its log: what every bench that starts a
//! server waits for. Shared by the bench binaries through `#[path]`; not a bench of its own.

use std::io::{BufRead, BufReader};
use std::process::Child;
use std::time::Duration;

/// The `host:port` of `child`'s "listening on http://…" line, read from its piped stderr by a
/// thread that keeps reading (handing each line to `each_line`) until the log ends; `None` when
/// no such line came within `within`.
pub fn listening_addr(
    child: &mut Child,
    within: Duration,
    mut each_line: impl FnMut(String) + Send + 'static,
) -> Option<String> {
    let stderr = BufReader::new(child.stderr.take().expect("the server's stderr is piped"));
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut tx = Some(tx);
        for line in stderr.lines().map_while(Result::ok) {
            if let Some(rest) = line.split("listening on http://").nth(1) {
                let addr: String = rest.chars().take_while(|c| !c.is_whitespace()).collect();
                if let Some(tx) = tx.take() {
                    let _ = tx.send(addr);
                }
            }
            each_line(line);
        }
    });
    rx.recv_timeout(within).ok()
}
