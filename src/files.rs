//! Opening the log and capture files so that no other local user can steer them: a job often runs
//! as root or as a service account, with a path from its environment (`/tmp/gdrshim.%p.log`).
//!
//! - the path is walked one component at a time with `openat(O_NOFOLLOW)`: a symbolic link
//!   anywhere in it is refused, so a link planted in a directory cannot move the file elsewhere;
//! - a new file is created with `O_EXCL`, mode 0600;
//! - an existing file is used only if it is a regular file, owned by the effective user, with one
//!   link (a planted file, or a hard link to somebody's file, is refused), checked on the open fd.
//!
//! Anything refused is said once by the caller, which then logs to stderr.

use crate::fd::OwnedFd;
use crate::fdtable::own;
use core::ffi::c_int;
use std::ffi::CString;

/// Why a path was refused, for the one warning.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    Empty,
    NulByte,
    /// A component is a symbolic link (or not a directory).
    Link(String),
    Missing(String),
    NotRegular,
    OtherOwner {
        owner: u32,
        me: u32,
    },
    Links(u64),
    Os(String, i32),
}

impl core::fmt::Display for Refused {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        match self {
            Refused::Empty => write!(f, "empty path"),
            Refused::NulByte => write!(f, "the path contains a NUL byte"),
            Refused::Link(c) => write!(f, "{c:?} is a symbolic link or not a folder (links are not followed; give the real path)"),
            Refused::Missing(c) => write!(f, "{c:?} does not exist"),
            Refused::NotRegular => write!(f, "not a regular file"),
            Refused::OtherOwner { owner, me } => write!(f, "the file exists and belongs to uid {owner}, not to this process's uid {me}"),
            Refused::Links(n) => write!(f, "the file has {n} hard links"),
            Refused::Os(what, e) => write!(f, "{what}: {}", std::io::Error::from_raw_os_error(*e)),
        }
    }
}

/// An fd of ours, opened in `dir` (a folder of ours; `None`: the working folder).
fn openat(
    dir: Option<&OwnedFd>,
    name: &CString,
    flags: c_int,
    mode: libc::mode_t,
) -> Result<OwnedFd, i32> {
    let f = crate::real::openat().ok_or(libc::ENOSYS)?;
    let _no_cancel = crate::sys::NoCancel::new();
    // no fork and no program close between the open and the adopt (fdtable::forkgate,
    // closegate): `dir` checked here is the folder the open walks from
    let _making = own::making();
    let dir = match dir {
        Some(d) if own::is_ours(d) => d.num(),
        Some(_) => return Err(libc::EBADF),
        None => libc::AT_FDCWD,
    };
    // SAFETY: a valid C string; openat has no other preconditions.
    let fd = unsafe { f(dir, name.as_ptr(), flags, mode) };
    if fd < 0 {
        Err(crate::sys::errno())
    } else {
        // (gone already: the program closed the number in between)
        own::adopt(fd).ok_or(libc::EBADF)
    }
}

fn close(fd: OwnedFd) {
    own::close(fd);
}

/// Opens `path` for appending, as the module says; the fd, ours, or why not.
pub fn open_private(path: &str) -> Result<OwnedFd, Refused> {
    if path.is_empty() {
        return Err(Refused::Empty);
    }
    let mut parts: Vec<&str> = path.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    let file = parts.pop().ok_or(Refused::Empty)?;
    let start = if path.starts_with('/') { "/" } else { "." };
    let mut dir = openat(
        None,
        &CString::new(start).expect("no NUL"),
        libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC,
        0,
    )
    .map_err(|e| Refused::Os(start.into(), e))?;
    let mut walked = String::from(if start == "/" { "" } else { "." });
    for c in parts {
        walked.push('/');
        walked.push_str(c);
        let name = CString::new(c).map_err(|_| Refused::NulByte)?;
        let next = openat(
            Some(&dir),
            &name,
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0,
        );
        close(dir);
        dir = match next {
            Ok(d) => d,
            Err(libc::ELOOP | libc::ENOTDIR) => return Err(Refused::Link(walked)),
            Err(libc::ENOENT) => return Err(Refused::Missing(walked)),
            Err(e) => return Err(Refused::Os(walked, e)),
        };
    }
    let name = CString::new(file).map_err(|_| Refused::NulByte)?;
    let base =
        libc::O_WRONLY | libc::O_APPEND | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NOCTTY;
    let r = match openat(Some(&dir), &name, base | libc::O_CREAT | libc::O_EXCL, 0o600) {
        Ok(fd) => Ok(fd),
        // look before opening for writing: a FIFO or a device could block or act on an open
        Err(libc::EEXIST) => match kind_of(&dir, &name) {
            Ok(libc::S_IFREG) => match openat(Some(&dir), &name, base | libc::O_NONBLOCK, 0) {
                Ok(fd) => check_existing(fd),
                Err(libc::ELOOP) => Err(Refused::Link(path.into())),
                Err(e) => Err(Refused::Os(path.into(), e)),
            },
            Ok(libc::S_IFLNK) => Err(Refused::Link(path.into())),
            Ok(_) => Err(Refused::NotRegular),
            Err(e) => Err(Refused::Os(path.into(), e)),
        },
        Err(e) => Err(Refused::Os(path.into(), e)),
    };
    close(dir);
    r
}

/// A small file of ours read whole, for gdrshim's own use (the driver's version, sysfs, NCCL's
/// configuration files): opened without blocking, read while the number is still ours
/// ([`own::read_some`]), closed only if it still is. `None`: not there or not readable (no such
/// file, no permission, a link loop); else its bytes, and whether they are all of it (`false`:
/// longer than `limit`, not a regular file, or a read that failed: what it holds is not known).
/// errno kept.
pub fn read_small(path: &str, limit: usize) -> Option<(Vec<u8>, bool)> {
    let e = crate::sys::errno();
    let r = read_small_inner(path, limit);
    crate::sys::set_errno(e);
    r
}

fn read_small_inner(path: &str, limit: usize) -> Option<(Vec<u8>, bool)> {
    let name = CString::new(path).ok()?;
    let flags = libc::O_RDONLY | libc::O_CLOEXEC | libc::O_NOCTTY | libc::O_NONBLOCK;
    let fd = match openat(None, &name, flags, 0) {
        Ok(fd) => fd,
        Err(libc::ENOENT | libc::ENOTDIR | libc::EACCES | libc::ELOOP | libc::ENAMETOOLONG) => {
            return None
        }
        Err(_) => return Some((Vec::new(), false)),
    };
    let regular = stat_of(&fd).is_some_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG);
    let mut buf = vec![0u8; limit + 1];
    let mut len = 0;
    let mut whole = regular;
    while regular && len < buf.len() {
        match own::read_some(&fd, &mut buf[len..]) {
            Some(0) => break,
            Some(n) => len += n,
            None => {
                whole = false;
                break;
            }
        }
    }
    close(fd);
    if len > limit {
        len = limit;
        whole = false;
    }
    buf.truncate(len);
    Some((buf, whole))
}

// (fstat64: the name std imports too, so the loader resolves one name fewer in every process)

/// The `fstat` of an fd of ours while its number is still ours (`None`: it is not, or the call
/// failed; errno says which).
fn stat_of(fd: &OwnedFd) -> Option<libc::stat64> {
    let Some(_in_use) = own::using(&[(fd.num(), fd.file())]) else {
        crate::sys::set_errno(libc::EBADF);
        return None;
    };
    // SAFETY: zeroed stat is a valid out-buffer.
    let mut st: libc::stat64 = unsafe { core::mem::zeroed() };
    // SAFETY: fstat writes into st only, on our own fd (held ours by `_in_use`).
    (unsafe { libc::fstat64(fd.num(), &mut st) } == 0).then_some(st)
}

/// The file type of `name` in `dir`, not following a link.
fn kind_of(dir: &OwnedFd, name: &CString) -> Result<libc::mode_t, i32> {
    let fd = openat(Some(dir), name, libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC, 0)?;
    let st = stat_of(&fd);
    let e = crate::sys::errno();
    close(fd);
    st.map(|st| st.st_mode & libc::S_IFMT).ok_or(e)
}

/// An existing file, opened: ours, regular, one link; else closed and refused.
fn check_existing(fd: OwnedFd) -> Result<OwnedFd, Refused> {
    let st = stat_of(&fd);
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let why = if let Some(st) = st {
        if st.st_mode & libc::S_IFMT != libc::S_IFREG {
            Some(Refused::NotRegular)
        } else if st.st_uid != me {
            Some(Refused::OtherOwner { owner: st.st_uid, me })
        } else if st.st_nlink != 1 {
            Some(Refused::Links(st.st_nlink))
        } else {
            None
        }
    } else {
        Some(Refused::Os("fstat".into(), crate::sys::errno()))
    };
    match why {
        Some(w) => {
            close(fd);
            Err(w)
        }
        None => {
            // O_NONBLOCK was only there so that opening a planted FIFO could not hang (the
            // flags of our file only: never a number the program took back meanwhile)
            if let Some(_in_use) = own::using(&[(fd.num(), fd.file())]) {
                // SAFETY: fcntl on our own fd, held ours by `_in_use`.
                unsafe { libc::fcntl(fd.num(), libc::F_SETFL, libc::O_APPEND) };
            }
            Ok(fd)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gdrshim-files-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn new_files_are_private_and_existing_own_files_are_appended() {
        let d = scratch("own");
        let p = d.join("log");
        let fd = open_private(p.to_str().unwrap()).unwrap();
        close(fd);
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&p).unwrap().permissions().mode() & 0o777, 0o600);
        std::fs::write(&p, "a\n").unwrap();
        let fd = open_private(p.to_str().unwrap()).unwrap();
        // SAFETY: our fd and a valid buffer.
        unsafe { libc::write(fd.num(), b"b\n".as_ptr().cast(), 2) };
        close(fd);
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "a\nb\n");
    }

    #[test]
    fn links_hard_links_and_odd_files_are_refused() {
        let d = scratch("hostile");
        std::fs::create_dir(d.join("real")).unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join("via")).unwrap();
        let via = d.join("via/log");
        assert!(
            matches!(open_private(via.to_str().unwrap()), Err(Refused::Link(c)) if c.ends_with("/via"))
        );
        assert!(!d.join("real/log").exists(), "nothing created through the link");
        std::fs::write(d.join("target"), "keep").unwrap();
        std::os::unix::fs::symlink(d.join("target"), d.join("flink")).unwrap();
        assert!(matches!(open_private(d.join("flink").to_str().unwrap()), Err(Refused::Link(_))));
        std::fs::hard_link(d.join("target"), d.join("hard")).unwrap();
        assert_eq!(open_private(d.join("hard").to_str().unwrap()), Err(Refused::Links(2)));
        assert_eq!(std::fs::read_to_string(d.join("target")).unwrap(), "keep");
        let fifo = CString::new(d.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(open_private(d.join("fifo").to_str().unwrap()), Err(Refused::NotRegular));
        assert!(
            matches!(open_private(d.join("no/such/log").to_str().unwrap()), Err(Refused::Missing(c)) if c.ends_with("/no"))
        );
        assert_eq!(open_private(""), Err(Refused::Empty));
    }

    #[test]
    fn small_files_are_read_whole_or_said_to_be_cut() {
        let d = scratch("read");
        let p = d.join("conf");
        std::fs::write(&p, "A=1\nB=2\n").unwrap();
        assert_eq!(read_small(p.to_str().unwrap(), 64), Some((b"A=1\nB=2\n".to_vec(), true)));
        assert_eq!(read_small(p.to_str().unwrap(), 4), Some((b"A=1\n".to_vec(), false)));
        assert_eq!(read_small(d.join("none").to_str().unwrap(), 64), None);
        // a FIFO nobody writes: not read, not waited on, not known
        let fifo = CString::new(d.join("fifo").to_str().unwrap()).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o600) }, 0);
        assert_eq!(read_small(d.join("fifo").to_str().unwrap(), 64), Some((vec![], false)));
    }
}
