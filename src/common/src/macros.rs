//! The pieces of hook code the front and the core both write out: the `dlsym`/`dlvsym` stubs
//! and the path argument of an `open` entry point.

/// The exported `dlsym` and `dlvsym`: assembly stubs that ask `$pick(handle, name, version)`
/// (version 0 for `dlsym`) what to do, then jump (never call) on with the caller's return address
/// still on the stack, so that glibc answers `RTLD_NEXT` for the real caller: 0, on to libc's
/// (`$dlsym`/`$dlvsym`, statics holding it); 1, answer NULL; anything else is `$found`'s to use
/// (the core returns it, the front jumps to it).
#[macro_export]
macro_rules! dl_stubs {
    ($(#[$attr:meta])* pick = $pick:path, dlsym = $dlsym:path, dlvsym = $dlvsym:path, found = $found:literal) => {
        /// # Safety
        /// Called by the dynamic linker's users exactly as glibc's `dlsym`.
        $(#[$attr])*
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn dlsym(handle: *mut core::ffi::c_void, name: *const core::ffi::c_char) -> *mut core::ffi::c_void {
            core::arch::naked_asm!(
                "push rdi",
                "push rsi",
                "sub rsp, 8",
                "xor edx, edx",
                "call {pick}",
                "add rsp, 8",
                "pop rsi",
                "pop rdi",
                "cmp rax, 1",
                "ja 2f",
                "je 3f",
                "jmp qword ptr [rip + {real}]",
                concat!("2: ", $found),
                "3: xor eax, eax",
                "ret",
                pick = sym $pick,
                real = sym $dlsym,
            )
        }

        /// # Safety
        /// Called exactly as glibc's `dlvsym`.
        $(#[$attr])*
        #[unsafe(naked)]
        #[no_mangle]
        pub unsafe extern "C" fn dlvsym(
            handle: *mut core::ffi::c_void,
            name: *const core::ffi::c_char,
            version: *const core::ffi::c_char,
        ) -> *mut core::ffi::c_void {
            core::arch::naked_asm!(
                "push rdi",
                "push rsi",
                "push rdx",
                "call {pick}",
                "pop rdx",
                "pop rsi",
                "pop rdi",
                "cmp rax, 1",
                "ja 2f",
                "je 3f",
                "jmp qword ptr [rip + {realv}]",
                concat!("2: ", $found),
                "3: xor eax, eax",
                "ret",
                pick = sym $pick,
                realv = sym $dlvsym,
            )
        }
    };
}

/// The path argument of an `open` entry point, by the name of its first parameter (none for
/// `open_by_handle_at`, whose first is `mount_fd`).
#[macro_export]
macro_rules! open_path {
    (dirfd, $path:ident $(, $rest:ident)*) => {
        $path
    };
    (mount_fd $(, $rest:ident)*) => {
        core::ptr::null()
    };
    ($path:ident $(, $rest:ident)*) => {
        $path
    };
}
