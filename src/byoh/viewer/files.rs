//! A session's workspace in the viewer: its files as a tree (`GET /ui/files?id=…`) and one
//! file's text (`…&path=…`), read-only.
//!
//! Invariants: every path goes through the workspace's path rules; on the host, through the
//! tools' byte API ([`files::read_bytes`],
//! [`files::list_files`]) and so through the workspace's path rules: a path outside the
//! workspace is refused, a listing never follows a symlink, and a read refuses a symlink, so a
//! link out of the workspace shows nothing of what it points at. The reads run where a file
//! tool's do ([`ToolboxBuilder::confined_reader`]): on a fresh thread confined to the workspace,
//! so a command that swaps a path, or a directory in it, for a symlink while the viewer reads
//! cannot lead the read outside; in a disk's image, [`image`] holds the same rules. At most
//! [`MAX_FILES`] entries
//! are listed and [`MAX_BYTES`] read. What a file holds is shown as escaped text.
//!
//! While a turn of the invocation runs (or its pause keeps background processes), the reads
//! go through that turn's toolbox ([`Toolbox::confined_read`]) and so join the session's mount
//! namespace, as its file tools do: a workspace on a disk of its own, or an overlay of the
//! workspace template, shows as the session's commands see it. Otherwise the viewer never
//! mounts a session's disk (a second mount beside a turn's would corrupt it): it reads the
//! host's view, or the image of the session's disk parsed in user space ([`image`]). An idle
//! session over the template at the overlay level is read through a read-only overlay of its
//! former upper layer over the template, mounted for the reading thread alone
//! ([`overlay::merged_view_on_thread`]): its deletions and replaced directories hold. On a
//! disk of its own the image holds its changes alone: the page shows those and says that the
//! template's files are not shown ([`TEMPLATE_NOTE`]).
//!
//! Non-goals: writing.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

use super::html::{esc, page, query};
use super::image::{self, ImageRead};
use crate::byoh::sandbox::{overlay_work_dir, session_disk_image, workspace_dir};
use crate::exec::overlay;
use crate::floor::workspace::{Access, Workspace};
use crate::tools::files::{self, FileRead, ListedFile, Listing};
use crate::tools::{Prepare, ToolOutcome, Toolbox, ToolboxBuilder};

/// Files a tree lists at most.
pub const MAX_FILES: u64 = 2000;
/// Bytes of a file shown at most.
pub const MAX_BYTES: u64 = 1 << 20;

/// What the page of a session whose workspace is an overlay of the template says first.
pub const TEMPLATE_NOTE: &str = "This session's workspace is a copy-on-write overlay of the \
    workspace template, mounted for its commands only. Shown here are its changes alone: the \
    files it wrote or changed. The template's files it left as they were are not shown, and \
    those it deleted are not marked.";

/// What the page shows: a listing, a file, or why neither.
enum Found {
    Tree(Vec<ListedFile>, bool),
    Text(String),
    Note(String),
}

fn refusal(outcome: ToolOutcome) -> Found {
    match outcome {
        ToolOutcome::Failed { message, .. } => Found::Note(message),
        _ => Found::Note("the workspace could not be read".into()),
    }
}

/// Reads the listing (no `path`) or the file `path` of `session`'s workspace, on a thread
/// confined to the workspace as a file tool's is: through `held`, the toolbox of the
/// invocation's turn while it runs (or waits for input with background processes), so in the
/// session's mount namespace, where its own disk or its template's overlay is mounted; else
/// on the host's view of the workspace.
async fn read(
    tools: &ToolboxBuilder,
    held: Option<Toolbox>,
    template: Option<PathBuf>,
    data: &Path,
    session: &str,
    path: Option<String>,
) -> Found {
    let dir = workspace_dir(data, session);
    if let Some(toolbox) = held {
        let Ok(ws) = Workspace::new(&dir, Some(Path::new("/workspace"))) else {
            return Found::Note("this session has no workspace on this host".into());
        };
        let found = toolbox
            .confined_read("view", move || read_in(&ws, path.as_deref()))
            .await;
        return found
            .unwrap_or_else(|e| Found::Note(format!("the workspace could not be read: {e}")));
    }
    let Ok(ws) = Workspace::new(&dir, Some(Path::new("/workspace"))) else {
        return Found::Note("this session has no workspace on this host".into());
    };
    let disk = session_disk_image(data, session);
    if disk.exists() {
        return tokio::task::spawn_blocking(move || read_image(&disk, &ws, path.as_deref()))
            .await
            .unwrap_or_else(|_| Found::Note("the read stopped".into()));
    }
    // An idle session over the template: the merged view, mounted for the reading thread.
    let prepare = template
        .filter(|_| overlay_work_dir(data, session).exists())
        .map(|template| -> Prepare {
            Box::new(move || {
                overlay::merged_view_on_thread(&dir, &template).map_err(|e| e.to_string())
            })
        });
    let reader = ws.clone();
    let found = tools
        .confined_reader(&ws, "view", prepare, move || {
            read_in(&reader, path.as_deref())
        })
        .await;
    found.unwrap_or_else(|e| Found::Note(format!("the workspace could not be read: {e}")))
}

/// [`read`] of an idle session's disk of its own: its image parsed in user space, read-only
/// (see [`image`]), after the workspace's path rules.
fn read_image(disk: &Path, ws: &Workspace, path: Option<&str>) -> Found {
    let unreadable = |e: String| Found::Note(format!("the session's disk could not be read: {e}"));
    let fs = match image::open(disk) {
        Ok(fs) => fs,
        Err(e) => return unreadable(e),
    };
    let Some(p) = path else {
        return match image::list(&fs, MAX_FILES) {
            Ok((entries, _)) if entries.is_empty() => Found::Note("the workspace is empty".into()),
            Ok((entries, truncated)) => Found::Tree(entries, truncated),
            Err(e) => unreadable(e),
        };
    };
    let resolved = match ws.resolve(p, Access::Read) {
        Ok(r) => r,
        Err(e) => return refusal(e.into()),
    };
    let Ok(rel) = resolved.host.strip_prefix(ws.root()) else {
        return Found::Note(format!("{p} is outside the workspace"));
    };
    match image::read(&fs, rel, MAX_BYTES) {
        Ok(ImageRead::Bytes(b)) => shown(p, b),
        Ok(ImageRead::Missing) => Found::Note(format!("nothing is at {p}")),
        Ok(ImageRead::Refused(why)) => Found::Note(format!("{p} is not shown: {why}")),
        Err(e) => unreadable(e),
    }
}

/// A file's bytes as the page shows them: text, or a note that it is binary.
fn shown(p: &str, b: Vec<u8>) -> Found {
    if b.contains(&0) {
        Found::Note(format!("{p} is binary ({} bytes)", b.len()))
    } else {
        Found::Text(String::from_utf8_lossy(&b).into_owned())
    }
}

/// [`read`] on its confined thread.
fn read_in(ws: &Workspace, path: Option<&str>) -> Found {
    match path {
        None => match files::list_files(ws, "/workspace", MAX_FILES, &CancellationToken::new()) {
            Listing::Listed { entries, truncated } => Found::Tree(entries, truncated),
            Listing::Missing => Found::Note("the workspace is empty".into()),
            Listing::Failed(o) => refusal(o),
        },
        Some(p) => match files::read_bytes(ws, p, MAX_BYTES) {
            FileRead::Bytes(b) => shown(p, b),
            FileRead::Missing => Found::Note(format!("nothing is at {p}")),
            FileRead::Failed(o) => refusal(o),
        },
    }
}

/// A directory of the tree: its files (name, size) and its subdirectories.
#[derive(Default)]
struct Dir {
    files: Vec<(String, String, u64)>,
    dirs: BTreeMap<String, Dir>,
}

fn tree(entries: &[ListedFile]) -> Dir {
    let mut root = Dir::default();
    for e in entries {
        let mut parts: Vec<&str> = e.path.split('/').collect();
        let name = parts.pop().unwrap_or_default();
        let mut dir = &mut root;
        for p in parts {
            dir = dir.dirs.entry(p.to_owned()).or_default();
        }
        dir.files.push((name.to_owned(), e.path.clone(), e.size));
    }
    root
}

fn draw(out: &mut String, dir: &Dir, id: &str) {
    out.push_str("<ul class=\"tree\">");
    for (name, sub) in &dir.dirs {
        let _ = write!(out, "<li><details open><summary>{}/</summary>", esc(name));
        draw(out, sub, id);
        out.push_str("</details></li>");
    }
    for (name, path, size) in &dir.files {
        let _ = write!(
            out,
            "<li><a href=\"/ui/files?{}\">{}</a> <span class=\"sub\">{size} B</span></li>",
            query(&[("id", id), ("path", &format!("/workspace/{path}"))]),
            esc(name)
        );
    }
    out.push_str("</ul>");
}

/// The page of `session`'s (invocation `id`'s) workspace, or of its file `path`; `held` is
/// the toolbox of the invocation's turn, when one runs here.
pub async fn page_of(
    tools: &ToolboxBuilder,
    held: Option<Toolbox>,
    template: Option<PathBuf>,
    data: &Path,
    id: &str,
    session: &str,
    path: Option<String>,
) -> String {
    // Changes alone are shown where no view merges them with the template: a disk's image
    // read in user space, or a template podhost no longer serves.
    let over_template = held.is_none()
        && overlay_work_dir(data, session).exists()
        && (template.is_none() || session_disk_image(data, session).exists());
    let found = read(tools, held, template, data, session, path.clone()).await;
    let mut out = String::new();
    let _ = write!(
        out,
        "<h1>Workspace of {}</h1><p><a href=\"/ui/session?{}\">Back to the session</a>",
        esc(session),
        query(&[("id", id)])
    );
    if path.is_some() {
        let _ = write!(
            out,
            " · <a href=\"/ui/files?{}\">All files</a>",
            query(&[("id", id)])
        );
    }
    out.push_str("</p>");
    if over_template {
        let _ = write!(
            out,
            "<p class=\"sub\" id=\"template-note\">{}</p>",
            esc(TEMPLATE_NOTE)
        );
    }
    if let Some(p) = &path {
        let _ = write!(out, "<h2>{}</h2>", esc(p));
    }
    match found {
        Found::Tree(entries, truncated) => {
            draw(&mut out, &tree(&entries), id);
            if truncated {
                let _ = write!(
                    out,
                    "<p class=\"sub\">Only the first {MAX_FILES} files.</p>"
                );
            }
        }
        Found::Text(text) => {
            let _ = write!(out, "<pre class=\"file\">{}</pre>", esc(&text));
        }
        Found::Note(note) => {
            let _ = write!(out, "<p class=\"empty\">{}</p>", esc(&note));
        }
    }
    page(&format!("Workspace of {session}"), &out)
}
