//! File-safety rules for reading a directory that may be hostile (a checkpoint someone else
//! wrote, a downloaded model) and for writing into one. Every checkpoint format of the crate
//! opens and writes its files through this module.
//!
//! Reading a file `name` of a directory:
//! - `name` must be a plain file name: no separator, not `.`/`..`, no leading dot (our own
//!   temporary files start with one);
//! - the entry is inspected without following it ([`std::fs::symlink_metadata`]): anything but
//!   a regular file (a FIFO, which would block `open` forever; a device such as `/dev/zero`,
//!   which never ends; a directory; a socket) is refused with [`FileProblem::NotRegular`];
//! - a symbolic link is followed only when its target, fully resolved, lies inside the
//!   directory (or inside a root the caller names that contains it, as a Hugging Face hub
//!   cache needs), and that target must be a regular file too ([`FileProblem::LeavesDirectory`]);
//! - the file is opened with `O_NOFOLLOW | O_NONBLOCK` (so a FIFO swapped in after the check
//!   cannot block) and the opened descriptor is checked again: still a regular file, and the
//!   same file as inspected ([`FileProblem::Replaced`]); its length is taken from the
//!   descriptor, and every size a file claims is checked against that length before anything
//!   is allocated for it;
//! - whole-file reads are capped ([`FileProblem::TooLarge`]).
//!
//! Writing goes through a temporary file created securely (`O_EXCL`, unpredictable name) in
//! the target's directory, synced, then renamed over the target: a crash leaves the old file
//! or the new one, and a symbolic link planted at either name is replaced, never followed.

use crate::error::{Error, FileKind, FileProblem, Result};
use std::fs::{File, Metadata};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

/// Largest `index.json` (or other whole-file read) accepted: 256 MiB, room for millions of
/// shard entries.
pub const MAX_INDEX_BYTES: u64 = 256 << 20;

/// What `meta` says the entry is.
fn kind_of(meta: &Metadata) -> FileKind {
    let t = meta.file_type();
    if t.is_dir() {
        return FileKind::Directory;
    }
    if t.is_symlink() {
        return FileKind::Symlink;
    }
    #[cfg(unix)]
    {
        use std::os::unix::fs::FileTypeExt;
        if t.is_fifo() {
            return FileKind::Fifo;
        }
        if t.is_char_device() {
            return FileKind::CharDevice;
        }
        if t.is_block_device() {
            return FileKind::BlockDevice;
        }
        if t.is_socket() {
            return FileKind::Socket;
        }
    }
    FileKind::Other
}

fn refused(path: &Path, problem: FileProblem) -> Error {
    Error::UnsafeFile { path: path.display().to_string(), problem }
}

fn io_error(path: &Path, what: &str, e: std::io::Error) -> Error {
    Error::Checkpoint { path: path.display().to_string(), reason: format!("{what}: {e}") }
}

/// Is `name` a plain file name (the only names a file may give for its siblings)?
pub(crate) fn is_plain_name(name: &str) -> bool {
    !name.is_empty() && !name.starts_with('.') && !name.contains(['/', '\\', '\0'])
}

/// A directory whose files are opened under the rules of the module docs.
#[derive(Debug, Clone)]
pub(crate) struct SafeDir {
    /// As the caller named it (for messages).
    shown: PathBuf,
    /// Fully resolved.
    resolved: PathBuf,
    /// Fully resolved; link targets must lie inside it (by default, the directory itself).
    link_root: PathBuf,
}

/// A regular file opened by [`SafeDir::open`], with its length at opening.
pub(crate) struct SafeFile {
    pub(crate) file: File,
    pub(crate) len: u64,
    pub(crate) path: PathBuf,
}

impl SafeDir {
    pub(crate) fn new(dir: &Path) -> Result<SafeDir> {
        let resolved = std::fs::canonicalize(dir).map_err(|e| io_error(dir, "cannot open the directory", e))?;
        let meta = std::fs::metadata(&resolved).map_err(|e| io_error(dir, "cannot open the directory", e))?;
        if !meta.is_dir() {
            return Err(io_error(dir, "cannot open the directory", std::io::ErrorKind::NotADirectory.into()));
        }
        Ok(SafeDir { shown: dir.to_path_buf(), link_root: resolved.clone(), resolved })
    }

    /// Lets symbolic links resolve anywhere inside `root`, which must contain the directory.
    pub(crate) fn with_link_root(mut self, root: &Path) -> Result<SafeDir> {
        let resolved = std::fs::canonicalize(root).map_err(|e| io_error(root, "cannot open the directory", e))?;
        if !self.resolved.starts_with(&resolved) {
            return Err(Error::InvalidArgument {
                context: format!("links allowed within `{}`", root.display()),
                reason: format!("it does not contain `{}`", self.shown.display()),
            });
        }
        self.link_root = resolved;
        Ok(self)
    }

    /// `name` inside the directory, as shown in messages.
    pub(crate) fn shown(&self, name: &str) -> PathBuf {
        self.shown.join(name)
    }

    /// Opens the regular file `name` for reading (the rules of the module docs).
    pub(crate) fn open(&self, name: &str) -> Result<SafeFile> {
        let shown = self.shown(name);
        if !is_plain_name(name) {
            return Err(refused(&shown, FileProblem::NotPlainName));
        }
        let entry = self.resolved.join(name);
        let mut meta = std::fs::symlink_metadata(&entry).map_err(|e| io_error(&shown, "cannot open", e))?;
        let mut target = entry;
        if meta.file_type().is_symlink() {
            target = std::fs::canonicalize(&target)
                .map_err(|e| io_error(&shown, "cannot open (a symbolic link that does not resolve)", e))?;
            if !target.starts_with(&self.link_root) {
                return Err(refused(&shown, FileProblem::LeavesDirectory { target: target.display().to_string() }));
            }
            meta = std::fs::symlink_metadata(&target).map_err(|e| io_error(&shown, "cannot open", e))?;
        }
        if !meta.is_file() {
            return Err(refused(&shown, FileProblem::NotRegular(kind_of(&meta))));
        }
        let file = open_no_follow(&target).map_err(|e| io_error(&shown, "cannot open", e))?;
        let opened = file.metadata().map_err(|e| io_error(&shown, "cannot stat", e))?;
        if !opened.is_file() {
            return Err(refused(&shown, FileProblem::NotRegular(kind_of(&opened))));
        }
        if !same_file(&meta, &opened) {
            return Err(refused(&shown, FileProblem::Replaced));
        }
        Ok(SafeFile { file, len: opened.len(), path: shown })
    }
}

/// Opens a path whose last component is not a link, never blocking (a FIFO swapped in after
/// the inspection opens at once and then fails the descriptor check).
#[cfg(unix)]
fn open_no_follow(path: &Path) -> std::io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    // O_NONBLOCK has no effect on reads of a regular file, so it may stay set.
    std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK).open(path)
}

#[cfg(not(unix))]
fn open_no_follow(path: &Path) -> std::io::Result<File> {
    File::open(path)
}

#[cfg(unix)]
fn same_file(a: &Metadata, b: &Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    (a.dev(), a.ino()) == (b.dev(), b.ino())
}

#[cfg(not(unix))]
fn same_file(_: &Metadata, _: &Metadata) -> bool {
    true
}

impl SafeFile {
    /// The whole file, refused when it is longer than `max` bytes.
    pub(crate) fn read_all(&mut self, max: u64) -> Result<Vec<u8>> {
        if self.len > max {
            return Err(refused(&self.path, FileProblem::TooLarge { len: self.len, max }));
        }
        // `len <= max` fits in memory terms; reading stops at `len` even if the file grows.
        let mut buf = crate::alloc::try_with_capacity("reading a file", self.len as usize)?;
        (&mut self.file).take(self.len).read_to_end(&mut buf).map_err(|e| io_error(&self.path, "cannot read", e))?;
        Ok(buf)
    }
}

/// Writes `path` atomically: `write` fills a securely created temporary file next to it,
/// which is synced and renamed over `path` (see the module docs).
pub(crate) fn write_atomic(path: &Path, write: impl FnOnce(&mut File) -> std::io::Result<()>) -> Result<()> {
    let cannot = |e| io_error(path, "cannot write", e);
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let name = path.file_name().ok_or_else(|| cannot(std::io::ErrorKind::InvalidInput.into()))?;
    let prefix = format!(".{}.", name.to_string_lossy());
    let mut builder = tempfile::Builder::new();
    builder.prefix(&prefix).suffix(".tmp");
    #[cfg(unix)]
    {
        // Readable like a file made by `fs::write` (the umask still applies), not only 0600.
        use std::os::unix::fs::PermissionsExt;
        builder.permissions(std::fs::Permissions::from_mode(0o644));
    }
    let mut tmp = builder.tempfile_in(dir).map_err(cannot)?;
    write(tmp.as_file_mut()).map_err(cannot)?;
    tmp.as_file_mut().flush().map_err(cannot)?;
    tmp.as_file().sync_all().map_err(cannot)?;
    tmp.persist(path).map_err(|e| cannot(e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_names() {
        for ok in ["index.json", "shard-00001.safetensors", "a..b"] {
            assert!(is_plain_name(ok), "{ok}");
        }
        for bad in ["", ".", "..", ".hidden", "a/b", "../x", "/etc/passwd", "a\\b", "a\0b"] {
            assert!(!is_plain_name(bad), "{bad:?}");
        }
    }

    /// The defences behind the inspection, for an entry swapped after it: opening a FIFO does
    /// not block, a link is not followed, and the descriptor check names what was opened.
    #[cfg(unix)]
    #[test]
    fn open_never_blocks_nor_follows() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let f = open_no_follow(&fifo).expect("a FIFO opens at once with O_NONBLOCK");
        assert_eq!(kind_of(&f.metadata().unwrap()), FileKind::Fifo);
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&fifo, &link).unwrap();
        assert!(open_no_follow(&link).is_err(), "O_NOFOLLOW");
        // Devices are refused on inspection, before any open.
        let dev = SafeDir::new(Path::new("/dev")).unwrap();
        let e = dev.open("null").err().unwrap();
        assert!(matches!(e, Error::UnsafeFile { problem: FileProblem::NotRegular(FileKind::CharDevice), .. }), "{e}");
        let e = SafeDir::new(dir.path()).unwrap().open("fifo").err().unwrap();
        assert!(matches!(e, Error::UnsafeFile { problem: FileProblem::NotRegular(FileKind::Fifo), .. }), "{e}");
    }

    #[test]
    fn atomic_write_leaves_only_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out.json");
        write_atomic(&p, |f| f.write_all(b"one")).unwrap();
        write_atomic(&p, |f| f.write_all(b"two")).unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        // A failing writer leaves the old file and no temporary file.
        let e = write_atomic(&p, |_| Err(std::io::ErrorKind::Other.into())).unwrap_err();
        assert!(matches!(e, Error::Checkpoint { .. }));
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn messages_name_the_problem() {
        let e = refused(Path::new("d/index.json"), FileProblem::NotRegular(FileKind::Fifo));
        assert_eq!(e.to_string(), "file `d/index.json` refused: it is a FIFO (named pipe), not a regular file");
        let e = refused(Path::new("x"), FileProblem::TooLarge { len: 10, max: 5 });
        assert_eq!(e.to_string(), "file `x` refused: it has 10 bytes, more than the 5 allowed");
    }
}
