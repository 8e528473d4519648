//! Where snapshots go: the [`SnapshotStore`] trait, an in-memory store and a file store
//! for a single machine. The cluster crate (`switchboard-cluster`) brings its own.
//!
//! A store keeps, per session, the last full snapshot and the deltas taken after it;
//! [`SnapshotStore::load`] gives the snapshot with every delta applied. A session told to
//! ([`SessionBuilder::save_snapshots`](crate::SessionBuilder::save_snapshots)) saves after
//! every settled turn: a delta, or a full snapshot when the store has none to apply it to
//! or has collected enough deltas.

use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use crate::snapshot::{SessionSnapshot, SnapshotDelta, SnapshotError};

/// Why a store could not save or load.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The file system refused (a missing folder, no room, no permission).
    #[error("snapshot store: {path}: {message}")]
    Io {
        /// The file or folder.
        path: String,
        /// What the system said.
        message: String,
    },
    /// What the store holds does not read as a snapshot.
    #[error("snapshot store: {0}")]
    Snapshot(#[from] SnapshotError),
    /// A delta for a session the store has no snapshot of, or that does not follow it:
    /// save a full snapshot first.
    #[error(
        "snapshot store: the delta for session {session:?} does not follow what the store holds"
    )]
    NoBase {
        /// The session.
        session: String,
    },
    /// A session id that cannot name a file here.
    #[error("snapshot store: session id {id:?} cannot name a file")]
    BadId {
        /// The id.
        id: String,
    },
    /// Another writer owns the session's snapshots now (a newer owner took the session
    /// over): this writer is stale and may not write it any more (fencing).
    #[error("snapshot store: session {session:?} is written by a newer owner: {reason}")]
    Fenced {
        /// The session.
        session: String,
        /// What the store found.
        reason: String,
    },
    /// A remote store could not be reached or did not answer (a network store: a server
    /// away, a timeout); a later write may succeed.
    #[error("snapshot store: session {session:?}: the store is unavailable: {reason}")]
    Unavailable {
        /// The session.
        session: String,
        /// What failed.
        reason: String,
    },
}

/// Where a session's snapshots go. Implement it to keep them in a database or an object
/// store; [`MemoryStore`] and [`FileStore`] ship with the engine.
pub trait SnapshotStore: Send + Sync + 'static {
    /// Saves a full snapshot, replacing whatever the store held for its session. Takes it
    /// by value: a store keeps or encodes it where it likes (off the session's thread),
    /// without a copy.
    fn save(&self, snapshot: SessionSnapshot) -> BoxFuture<'static, Result<(), StoreError>>;

    /// Adds a delta to what the store holds for its session; [`StoreError::NoBase`] when
    /// it does not follow it (the session then saves a full snapshot).
    fn append(&self, delta: SnapshotDelta) -> BoxFuture<'static, Result<(), StoreError>>;

    /// The session's last snapshot with every delta after it applied, if there is one.
    fn load(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>>;

    /// Forgets the session.
    fn remove(&self, session: &str) -> BoxFuture<'static, Result<(), StoreError>>;
}

/// Snapshots in memory: for tests, and for moving a session between engines of one
/// process. Cheap to clone; clones share the store.
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    sessions: Arc<Mutex<HashMap<String, SessionSnapshot>>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, SessionSnapshot>> {
        // A map of values: a panic elsewhere cannot leave it half-written.
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl SnapshotStore for MemoryStore {
    fn save(&self, snapshot: SessionSnapshot) -> BoxFuture<'static, Result<(), StoreError>> {
        self.lock()
            .insert(snapshot.session_id().to_owned(), snapshot);
        async { Ok(()) }.boxed()
    }

    fn append(&self, delta: SnapshotDelta) -> BoxFuture<'static, Result<(), StoreError>> {
        let result = match self.lock().get_mut(delta.session_id()) {
            // A delta of another chain does not follow what is here: save in full.
            Some(snapshot) if snapshot.seq() != delta.base() => Err(StoreError::NoBase {
                session: delta.session_id().to_owned(),
            }),
            Some(snapshot) => snapshot.apply(&delta).map_err(StoreError::from),
            None => Err(StoreError::NoBase {
                session: delta.session_id().to_owned(),
            }),
        };
        async move { result }.boxed()
    }

    fn load(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>> {
        let found = self.lock().get(session).cloned();
        async move { Ok(found) }.boxed()
    }

    fn remove(&self, session: &str) -> BoxFuture<'static, Result<(), StoreError>> {
        self.lock().remove(session);
        async { Ok(()) }.boxed()
    }
}

/// Snapshots in files of one folder, for a single machine: per session, the last full
/// snapshot (`<id>.snap`, the binary form) and the deltas after it (`<id>.log`, binary
/// frames one after another).
///
/// A snapshot is the user's conversation, so: the folder is made readable by its owner
/// only (0700) and every file is created 0600; no file is opened through a symbolic link
/// (a link planted in the folder is refused, never followed out of it); a full snapshot
/// replaces the old one atomically (written beside it, flushed, then renamed over it), so
/// a crash mid-write leaves the previous snapshot whole; a crash mid-append leaves a
/// truncated last delta, which loading ignores. File work runs on tokio's blocking pool.
#[derive(Clone, Debug)]
pub struct FileStore {
    dir: Arc<PathBuf>,
}

impl FileStore {
    /// A store in `dir`, created (0700) if it does not exist.
    pub fn new(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        let dir = dir.as_ref();
        fs::create_dir_all(dir).map_err(|err| io_error(dir, err))?;
        let meta = fs::symlink_metadata(dir).map_err(|err| io_error(dir, err))?;
        if !meta.is_dir() {
            return Err(StoreError::Io {
                path: dir.display().to_string(),
                message: "not a folder (a symbolic link is not followed)".to_owned(),
            });
        }
        fs::set_permissions(dir, fs::Permissions::from_mode(0o700))
            .map_err(|err| io_error(dir, err))?;
        Ok(Self {
            dir: Arc::new(dir.to_path_buf()),
        })
    }

    /// The folder it writes in.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn paths(&self, session: &str) -> Result<(PathBuf, PathBuf, PathBuf), StoreError> {
        let name = file_name(session)?;
        Ok((
            self.dir.join(format!("{name}.snap")),
            self.dir.join(format!("{name}.log")),
            self.dir.join(format!("{name}.snap.tmp")),
        ))
    }

    fn blocking<T: Send + 'static>(
        work: impl FnOnce() -> Result<T, StoreError> + Send + 'static,
    ) -> BoxFuture<'static, Result<T, StoreError>> {
        async move {
            tokio::task::spawn_blocking(work)
                .await
                .unwrap_or_else(|err| {
                    Err(StoreError::Io {
                        path: String::new(),
                        message: format!("the file work stopped: {err}"),
                    })
                })
        }
        .boxed()
    }
}

/// A file name for a session id: letters, digits, `-` and `_` kept, every other byte
/// written `%XX`, so an id can never name a path outside the folder.
fn file_name(session: &str) -> Result<String, StoreError> {
    if session.is_empty() || session.len() > 200 {
        return Err(StoreError::BadId {
            id: session.chars().take(64).collect(),
        });
    }
    let mut name = String::with_capacity(session.len());
    for byte in session.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
            name.push(char::from(byte));
        } else {
            name.push_str(&format!("%{byte:02X}"));
        }
    }
    Ok(name)
}

fn io_error(path: &Path, err: std::io::Error) -> StoreError {
    StoreError::Io {
        path: path.display().to_string(),
        message: err.to_string(),
    }
}

/// Writes a folder's entries to disk (after a rename in it).
fn sync_dir(dir: &Path) -> Result<(), StoreError> {
    File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(|err| io_error(dir, err))
}

/// Opens for writing, never through a symbolic link, as 0600 (also a file left by a
/// crash with other permissions: the mode is set on the open file, not only at creation).
fn open_write(path: &Path, append: bool) -> Result<File, StoreError> {
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW);
    if append {
        options.append(true);
    } else {
        options.truncate(true);
    }
    let file = options.open(path).map_err(|err| io_error(path, err))?;
    file.set_permissions(fs::Permissions::from_mode(0o600))
        .map_err(|err| io_error(path, err))?;
    Ok(file)
}

/// Reads a whole file, never through a symbolic link; `None` when it does not exist.
fn read_file(path: &Path) -> Result<Option<Vec<u8>>, StoreError> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path);
    let mut file = match file {
        Ok(file) => file,
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(err) => return Err(io_error(path, err)),
    };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|err| io_error(path, err))?;
    Ok(Some(bytes))
}

/// The length of the binary frame at the start of `bytes`, if its header is all there.
fn frame_len(bytes: &[u8]) -> Option<usize> {
    let header = 4 + 1 + 4 + 8 + 4;
    let len = bytes.get(9..17)?;
    let mut word = [0u8; 8];
    word.copy_from_slice(len);
    usize::try_from(u64::from_le_bytes(word))
        .ok()?
        .checked_add(header)
}

impl SnapshotStore for FileStore {
    fn save(&self, snapshot: SessionSnapshot) -> BoxFuture<'static, Result<(), StoreError>> {
        let paths = self.paths(snapshot.session_id());
        Self::blocking(move || {
            let (snap, log, tmp) = paths?;
            // Encoded here, on the blocking pool: a long conversation takes milliseconds.
            let bytes = snapshot.to_bytes();
            let mut file = open_write(&tmp, false)?;
            file.write_all(&bytes).map_err(|err| io_error(&tmp, err))?;
            file.sync_all().map_err(|err| io_error(&tmp, err))?;
            fs::rename(&tmp, &snap).map_err(|err| io_error(&snap, err))?;
            // The rename is durable only once the folder is written.
            sync_dir(snap.parent().unwrap_or(Path::new(".")))?;
            // The deltas applied to the old snapshot: the new one holds them. A crash
            // before this removal leaves them; loading skips deltas it already holds.
            match fs::remove_file(&log) {
                Ok(()) => Ok(()),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(err) => Err(io_error(&log, err)),
            }
        })
    }

    fn append(&self, delta: SnapshotDelta) -> BoxFuture<'static, Result<(), StoreError>> {
        let paths = self.paths(delta.session_id());
        let session = delta.session_id().to_owned();
        Self::blocking(move || {
            let bytes = delta.to_bytes();
            let (snap, log, _) = paths?;
            // Only whether a base is there: reading it would make every save cost the
            // whole conversation. Whether the delta follows it is checked when loading.
            match fs::symlink_metadata(&snap) {
                Ok(meta) if meta.is_file() => {}
                Ok(_) => return Err(StoreError::NoBase { session }),
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    return Err(StoreError::NoBase { session })
                }
                Err(err) => return Err(io_error(&snap, err)),
            }
            let mut file = open_write(&log, true)?;
            file.write_all(&bytes).map_err(|err| io_error(&log, err))?;
            file.sync_data().map_err(|err| io_error(&log, err))
        })
    }

    fn load(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>> {
        let paths = self.paths(session);
        Self::blocking(move || {
            let (snap, log, _) = paths?;
            let Some(bytes) = read_file(&snap)? else {
                return Ok(None);
            };
            let mut snapshot = SessionSnapshot::from_bytes(&bytes)?;
            let log = read_file(&log)?.unwrap_or_default();
            let mut rest = log.as_slice();
            while !rest.is_empty() {
                // A crash mid-append leaves a truncated last delta: the snapshot before it
                // is whole, and is what the store has.
                let Some(len) = frame_len(rest).filter(|len| *len <= rest.len()) else {
                    break;
                };
                let delta = SnapshotDelta::from_bytes(&rest[..len])?;
                rest = &rest[len..];
                if delta.base() < snapshot.seq {
                    // Already in the full snapshot (a crash between its rename and the
                    // log's removal).
                    continue;
                }
                snapshot.apply(&delta)?;
            }
            Ok(Some(snapshot))
        })
    }

    fn remove(&self, session: &str) -> BoxFuture<'static, Result<(), StoreError>> {
        let paths = self.paths(session);
        Self::blocking(move || {
            let (snap, log, _) = paths?;
            for path in [snap, log] {
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
                    Err(err) => return Err(io_error(&path, err)),
                }
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_id_never_names_a_path_outside_the_folder() {
        assert_eq!(file_name("call-42_a").unwrap(), "call-42_a");
        assert_eq!(file_name("../etc/passwd").unwrap(), "%2E%2E%2Fetc%2Fpasswd");
        assert_eq!(file_name("a b").unwrap(), "a%20b");
        assert!(file_name("").is_err());
        assert!(file_name(&"x".repeat(500)).is_err());
    }
}
