//! [`FileStore`]: snapshots in files of one folder, on the [`SnapshotStore`] contract, for
//! one machine and any number of processes on it.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use futures_util::future::BoxFuture;
use futures_util::FutureExt;

use super::{fenced, Claim, ClaimRule, Claimed, SnapshotStore, StoreVersion};
use crate::snapshot::{crc32, SessionSnapshot, SnapshotDelta, StoreError};
use crate::snapshot_chain::SnapshotChain;

/// Snapshots in files of one folder, for a single machine: per session, the last full
/// snapshot (`<id>.snap`, the binary form), the deltas after it (`<id>.log`, binary frames
/// one after another) and the session's claim record (`<id>.claim`: the epoch of the last
/// claim, the record's version, where the chain is).
///
/// Every claim and write follows the [`SnapshotStore`] contract across processes: of two
/// processes that restore one session from one folder, the second's claim is refused
/// ([`StoreError::Fenced`]); a takeover's claim fences the writer before it, whose next
/// write is refused. Each claim or write holds an exclusive lock on the session's claim
/// record (`flock`) while it checks the record (the claim's rule, the writer's version)
/// and writes; a load holds a shared one.
///
/// A snapshot is the user's conversation, so: the folder is made readable by its owner
/// only (0700) and every file is created 0600; no file is opened through a symbolic link
/// (a link planted in the folder is refused, never followed out of it); a full snapshot
/// replaces the old one atomically (written beside it, flushed, then renamed over it), so
/// a crash mid-write leaves the previous snapshot whole; a crash mid-append leaves a
/// truncated last delta, which loading ignores and the next claim cuts off. File work runs
/// on tokio's blocking pool.
#[derive(Clone, Debug)]
pub struct FileStore {
    dir: Arc<PathBuf>,
}

/// The files of one session.
struct Paths {
    snap: PathBuf,
    log: PathBuf,
    tmp: PathBuf,
    claim: PathBuf,
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

    fn paths(&self, session: &str) -> Result<Paths, StoreError> {
        let name = file_name(session)?;
        Ok(Paths {
            snap: self.dir.join(format!("{name}.snap")),
            log: self.dir.join(format!("{name}.log")),
            tmp: self.dir.join(format!("{name}.snap.tmp")),
            claim: self.dir.join(format!("{name}.claim")),
        })
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

/// A session's claim record (`<id>.claim`), kept in one small file that is also the
/// session's lock.
///
/// Why a locked record and not a record replaced by rename: a compare-and-set needs the
/// comparison and the write under one lock — a rename replaces atomically but cannot
/// compare, so two processes could each read version 7 and each rename their version 8
/// over the other's. `flock` gives that lock across processes, and the kernel releases it
/// when its process dies, so a crash never leaves a session locked (a lock *file* that
/// exists or not would stay behind a crash). The record is rewritten in place under the
/// lock; it is not flushed to disk at each write, because only the processes of this
/// machine read it and they share the page cache. After the machine itself crashes, every
/// writer is gone with it: the next claim reads the record (a torn one reads as none) and
/// takes its epoch above both the record's and the stored snapshot's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ClaimRecord {
    /// The last claim's epoch.
    epoch: u64,
    /// Moves with every claim and write.
    version: u64,
    /// The chain's `seq` as written (what the next delta's base must be); `None`: no full
    /// snapshot yet.
    chain: Option<u64>,
    /// How much of the log is the chain: an append writes there, cutting off whatever a
    /// failed append left after it.
    log_len: u64,
}

const RECORD_MAGIC: &[u8; 4] = b"SBCL";
/// Magic, format, whether `chain` is set, two spare bytes, four numbers, CRC-32.
const RECORD_LEN: usize = 4 + 1 + 1 + 2 + 8 * 4 + 4;

impl ClaimRecord {
    fn encode(&self) -> [u8; RECORD_LEN] {
        let mut out = [0u8; RECORD_LEN];
        out[..4].copy_from_slice(RECORD_MAGIC);
        out[4] = 1;
        out[5] = u8::from(self.chain.is_some());
        let numbers = [
            self.epoch,
            self.version,
            self.chain.unwrap_or(0),
            self.log_len,
        ];
        for (i, n) in numbers.iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&n.to_le_bytes());
        }
        let crc = crc32(&out[..RECORD_LEN - 4]);
        out[RECORD_LEN - 4..].copy_from_slice(&crc.to_le_bytes());
        out
    }

    /// The record in `bytes`; `None` for no record or a torn one.
    fn decode(bytes: &[u8]) -> Option<Self> {
        let bytes = bytes.get(..RECORD_LEN)?;
        if &bytes[..4] != RECORD_MAGIC || bytes[4] != 1 {
            return None;
        }
        let mut crc = [0u8; 4];
        crc.copy_from_slice(&bytes[RECORD_LEN - 4..]);
        if crc32(&bytes[..RECORD_LEN - 4]) != u32::from_le_bytes(crc) {
            return None;
        }
        let number = |i: usize| {
            let mut word = [0u8; 8];
            word.copy_from_slice(&bytes[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(word)
        };
        Some(Self {
            epoch: number(0),
            version: number(1),
            chain: (bytes[5] == 1).then(|| number(2)),
            log_len: number(3),
        })
    }
}

/// A session's claim record file, locked.
struct Locked {
    file: File,
    path: PathBuf,
}

impl Locked {
    /// Opens `path` and locks it (exclusively, or shared for reading); `None` when it does
    /// not exist and `create` is off.
    fn open(path: &Path, exclusive: bool, create: bool) -> Result<Option<Self>, StoreError> {
        loop {
            let mut options = OpenOptions::new();
            // Written only under the exclusive lock.
            options
                .read(true)
                .write(exclusive)
                .custom_flags(libc::O_NOFOLLOW);
            if create {
                options.create(true).mode(0o600);
            }
            let file = match options.open(path) {
                Ok(file) => file,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound && !create => {
                    return Ok(None)
                }
                Err(err) => return Err(io_error(path, err)),
            };
            flock(&file, exclusive, path)?;
            // Removed (and maybe made again) while this waited for the lock: a lock on a
            // file no longer in the folder guards nothing, so open the one there now.
            let held = file.metadata().map_err(|err| io_error(path, err))?;
            match fs::symlink_metadata(path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => {
                    if create {
                        file.set_permissions(fs::Permissions::from_mode(0o600))
                            .map_err(|err| io_error(path, err))?;
                    }
                    return Ok(Some(Self {
                        file,
                        path: path.to_path_buf(),
                    }));
                }
                Ok(_) => continue,
                Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                    if create {
                        continue;
                    }
                    return Ok(None);
                }
                Err(err) => return Err(io_error(path, err)),
            }
        }
    }

    /// The record (`None`: none yet, or torn by a crash of the machine).
    fn read(&self) -> Result<Option<ClaimRecord>, StoreError> {
        let mut bytes = [0u8; RECORD_LEN];
        let mut got = 0;
        while got < RECORD_LEN {
            match self.file.read_at(&mut bytes[got..], got as u64) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(err) if err.kind() == std::io::ErrorKind::Interrupted => {}
                Err(err) => return Err(io_error(&self.path, err)),
            }
        }
        Ok(ClaimRecord::decode(&bytes[..got]))
    }

    fn write(&self, record: &ClaimRecord, durable: bool) -> Result<(), StoreError> {
        self.file
            .write_all_at(&record.encode(), 0)
            .map_err(|err| io_error(&self.path, err))?;
        if durable {
            self.file
                .sync_data()
                .map_err(|err| io_error(&self.path, err))?;
        }
        Ok(())
    }

    /// The claim record at `path`, locked for a write, if `after` is its version (the
    /// writer is the latest).
    fn for_write(
        path: &Path,
        session: &str,
        after: StoreVersion,
    ) -> Result<(Self, ClaimRecord), StoreError> {
        let locked = Self::open(path, true, false)?.ok_or_else(|| {
            fenced(
                session,
                "the session has no claim record (never claimed, or removed)",
            )
        })?;
        let record = locked.writable(session, after)?;
        Ok((locked, record))
    }

    /// Writes `record` as the record's next version (after a write of the files); that
    /// version.
    fn moved(&self, record: ClaimRecord) -> Result<StoreVersion, StoreError> {
        let record = ClaimRecord {
            version: record.version.saturating_add(1),
            ..record
        };
        self.write(&record, false)?;
        Ok(StoreVersion::new(record.version))
    }

    /// The record, if `after` is its version (the writer is the latest).
    fn writable(&self, session: &str, after: StoreVersion) -> Result<ClaimRecord, StoreError> {
        match self.read()? {
            Some(record) if record.version == after.get() => Ok(record),
            Some(record) => Err(fenced(
                session,
                format!(
                    "the record is at version {}, this writer last saw {} (claimed since, at epoch {})",
                    record.version,
                    after.get(),
                    record.epoch
                ),
            )),
            None => Err(fenced(
                session,
                "the session has no claim record (never claimed, or removed)",
            )),
        }
    }
}

/// Takes the lock; waits for it (on the blocking pool) while another process holds it.
fn flock(file: &File, exclusive: bool, path: &Path) -> Result<(), StoreError> {
    let operation = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    loop {
        // SAFETY: the descriptor is open for the whole call: `file` owns it and outlives
        // it. `flock` reads nothing else of this process's memory.
        let done = unsafe { libc::flock(file.as_raw_fd(), operation) };
        if done == 0 {
            return Ok(());
        }
        let err = std::io::Error::last_os_error();
        if err.kind() != std::io::ErrorKind::Interrupted {
            return Err(io_error(path, err));
        }
    }
}

/// The first version of a new record: the clock, in nanoseconds, so a session removed and
/// claimed again does not start where the old record's versions were (a writer of the old
/// one could hold them).
fn first_version() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |since| {
            u64::try_from(since.as_nanos()).unwrap_or(u64::MAX / 2)
        })
        .max(1)
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
fn open_write(path: &Path, truncate: bool) -> Result<File, StoreError> {
    let mut options = OpenOptions::new();
    options
        .write(true)
        .create(true)
        .truncate(truncate)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW);
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

fn remove_if_there(path: &Path) -> Result<(), StoreError> {
    match fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(err) => Err(io_error(path, err)),
    }
}

/// The session's chain as its files hold it, and how much of the log is part of it.
fn read_chain(session: &str, paths: &Paths) -> Result<(SnapshotChain, usize), StoreError> {
    let mut chain = SnapshotChain::new();
    let Some(bytes) = read_file(&paths.snap)? else {
        return Ok((chain, 0));
    };
    chain.full(SessionSnapshot::from_bytes(&bytes)?);
    let log = read_file(&paths.log)?.unwrap_or_default();
    let read = chain.frames(&log);
    if let Some(end) = chain.end() {
        if end.torn {
            // A crash mid-append: the chain before it is whole.
            tracing::debug!(session, reason = %end.reason, "a torn last delta is left out");
        } else {
            tracing::warn!(session, reason = %end.reason, "the snapshot log has a delta that does not follow: the chain ends before it");
        }
    }
    Ok((chain, read))
}

impl SnapshotStore for FileStore {
    fn claim(
        &self,
        session: &str,
        rule: ClaimRule,
    ) -> BoxFuture<'static, Result<Claimed, StoreError>> {
        let paths = self.paths(session);
        let session = session.to_owned();
        Self::blocking(move || {
            let paths = paths?;
            let locked = Locked::open(&paths.claim, true, true)?;
            let locked = locked.ok_or_else(|| fenced(&session, "the claim record vanished"))?;
            let before = locked.read()?;
            let (chain, read) = read_chain(&session, &paths)?;
            let snapshot = chain.into_snapshot();
            // The last claim: the record's, and at least the stored snapshot's (a record
            // torn by a crash of the machine reads as none).
            let last = before
                .map_or(0, |r| r.epoch)
                .max(snapshot.as_ref().map_or(0, SessionSnapshot::epoch));
            // Decided under the lock, before anything is written: a refused claim leaves
            // the files as they were.
            let epoch = rule.epoch_after(&session, last)?;
            // What the log holds past the chain (a torn last append) is cut off, so the
            // next append follows the chain.
            if fs::symlink_metadata(&paths.log).is_ok_and(|meta| meta.len() > read as u64) {
                let log = open_write(&paths.log, false)?;
                log.set_len(read as u64)
                    .map_err(|err| io_error(&paths.log, err))?;
            }
            let record = ClaimRecord {
                epoch,
                version: before.map_or_else(first_version, |r| r.version.saturating_add(1)),
                chain: snapshot.as_ref().map(SessionSnapshot::seq),
                log_len: read as u64,
            };
            // Flushed: the rare write that issues an epoch.
            locked.write(&record, true)?;
            Ok(Claimed::new(
                Claim::new(session, epoch, StoreVersion::new(record.version)),
                snapshot,
            ))
        })
    }

    fn save(
        &self,
        snapshot: SessionSnapshot,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        let paths = self.paths(snapshot.session_id());
        Self::blocking(move || {
            let paths = paths?;
            let session = snapshot.session_id();
            let (locked, record) = Locked::for_write(&paths.claim, session, after)?;
            // Encoded here, on the blocking pool: a long conversation takes milliseconds.
            let bytes = snapshot.to_bytes();
            let mut file = open_write(&paths.tmp, true)?;
            file.write_all(&bytes)
                .map_err(|err| io_error(&paths.tmp, err))?;
            file.sync_all().map_err(|err| io_error(&paths.tmp, err))?;
            fs::rename(&paths.tmp, &paths.snap).map_err(|err| io_error(&paths.snap, err))?;
            // The rename is durable only once the folder is written.
            sync_dir(paths.snap.parent().unwrap_or(Path::new(".")))?;
            // The deltas applied to the old snapshot: the new one holds them. A crash
            // before this removal leaves them; loading skips deltas it already holds.
            remove_if_there(&paths.log)?;
            locked.moved(ClaimRecord {
                chain: Some(snapshot.seq()),
                log_len: 0,
                ..record
            })
        })
    }

    fn append(
        &self,
        delta: SnapshotDelta,
        after: StoreVersion,
    ) -> BoxFuture<'static, Result<StoreVersion, StoreError>> {
        let paths = self.paths(delta.session_id());
        Self::blocking(move || {
            let paths = paths?;
            let session = delta.session_id();
            let (locked, record) = Locked::for_write(&paths.claim, session, after)?;
            if record.chain != Some(delta.base()) {
                return Err(StoreError::NoBase {
                    session: session.to_owned(),
                });
            }
            let bytes = delta.to_bytes();
            let log = open_write(&paths.log, false)?;
            // Written where the chain ends: whatever a failed append left after it goes.
            log.set_len(record.log_len)
                .map_err(|err| io_error(&paths.log, err))?;
            log.write_all_at(&bytes, record.log_len)
                .map_err(|err| io_error(&paths.log, err))?;
            log.sync_data().map_err(|err| io_error(&paths.log, err))?;
            locked.moved(ClaimRecord {
                chain: Some(delta.base() + 1),
                log_len: record.log_len + bytes.len() as u64,
                ..record
            })
        })
    }

    fn load(
        &self,
        session: &str,
    ) -> BoxFuture<'static, Result<Option<SessionSnapshot>, StoreError>> {
        let paths = self.paths(session);
        let session = session.to_owned();
        Self::blocking(move || {
            let paths = paths?;
            // Shared: no write changes the files while they are read. (Without a claim
            // record, nobody writes the session.)
            let _locked = Locked::open(&paths.claim, false, false)?;
            Ok(read_chain(&session, &paths)?.0.into_snapshot())
        })
    }

    fn remove(&self, session: &str) -> BoxFuture<'static, Result<(), StoreError>> {
        let paths = self.paths(session);
        Self::blocking(move || {
            let paths = paths?;
            let locked = Locked::open(&paths.claim, true, false)?;
            remove_if_there(&paths.snap)?;
            remove_if_there(&paths.log)?;
            // Last, still locked: whoever waits for the lock finds it gone and opens the
            // one there now, if any.
            if locked.is_some() {
                remove_if_there(&paths.claim)?;
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

    #[test]
    fn a_claim_record_reads_back_and_a_torn_one_reads_as_none() {
        let record = ClaimRecord {
            epoch: 3,
            version: 1_700_000_000_000_000_123,
            chain: Some(17),
            log_len: 4096,
        };
        let bytes = record.encode();
        assert_eq!(ClaimRecord::decode(&bytes), Some(record));
        let none = ClaimRecord {
            chain: None,
            ..record
        };
        assert_eq!(ClaimRecord::decode(&none.encode()), Some(none));
        assert_eq!(ClaimRecord::decode(&bytes[..RECORD_LEN - 1]), None);
        let mut changed = bytes;
        changed[9] ^= 1;
        assert_eq!(ClaimRecord::decode(&changed), None);
        assert_eq!(ClaimRecord::decode(&[]), None);
    }
}
