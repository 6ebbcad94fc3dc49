//! An fd gdrshim keeps for itself, as a value: its number and the file it was made as. A program
//! may close any number it likes (a daemon's `closefrom`, `close_range`, `dup2` over it) and
//! get the number back for a file of its own; gdrshim must then never close, use or hand out
//! that number again. So an fd of ours is not a bare `i32`: it is an [`OwnedFd`], one value per
//! open file, which is neither `Copy` nor `Clone`, and which only the layer that made it closes
//! (`fdtable::own`, through `Rm::close_fd` for the registrar), after checking that the number
//! is still this file. A call that only uses it gets the number for the duration of the call.
#![forbid(unsafe_code)]

/// What file an fd is, by its `fstat`: device and inode (each dma-buf, each regular file is its
/// own), and for a device node the device number it opens.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub rdev: u64,
}

/// An fd of gdrshim's own. Dropping one neither closes nor forgets it: give it back to its
/// maker to be closed, or hand it to a caller, explicitly.
#[must_use = "an fd of ours is closed, kept or handed out, never dropped"]
#[derive(Debug, PartialEq, Eq)]
pub struct OwnedFd {
    num: i32,
    file: FileId,
}

impl OwnedFd {
    /// The fd `num`, made just now as `file` (only its maker calls this).
    pub fn new(num: i32, file: FileId) -> OwnedFd {
        OwnedFd { num, file }
    }

    /// The number, for one call made while this value is held.
    pub fn num(&self) -> i32 {
        self.num
    }

    pub fn file(&self) -> FileId {
        self.file
    }

    /// Number and file, consumed: for the maker's close or hand-out only.
    pub fn into_parts(self) -> (i32, FileId) {
        (self.num, self.file)
    }
}
