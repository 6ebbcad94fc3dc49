//! Exported hooks that must know who called them: the verbs and libmlx5 entry points, whose real
//! function is the copy of the library the caller would reach without gdrshim
//! (`real::scope::for_caller`). Each is an assembly stub that hands its caller's return address
//! to the hook as one argument more, after the C signature's `N`, and leaves every other register
//! as the caller set it: a tail jump for up to five arguments; for six, a call with the address
//! as the seventh argument, on the stack.

/// `with_caller!(name, inner, N)`: the exported `name`, whose C signature has `N` arguments,
/// calling `inner(args…, caller: usize)`.
macro_rules! with_caller {
    ($name:ident, $inner:path, 1) => { $crate::hooks::caller::with_caller!(@jump $name, $inner, "mov rsi, qword ptr [rsp]"); };
    ($name:ident, $inner:path, 2) => { $crate::hooks::caller::with_caller!(@jump $name, $inner, "mov rdx, qword ptr [rsp]"); };
    ($name:ident, $inner:path, 4) => { $crate::hooks::caller::with_caller!(@jump $name, $inner, "mov r8, qword ptr [rsp]"); };
    ($name:ident, $inner:path, 5) => { $crate::hooks::caller::with_caller!(@jump $name, $inner, "mov r9, qword ptr [rsp]"); };
    ($name:ident, $inner:path, 6) => {
        /// # Safety
        /// As the C function of this name.
        #[unsafe(naked)]
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!(
                // the caller's return address as the seventh argument (at entry rsp is 8 off
                // 16-byte alignment: after the push it is aligned for the call)
                "mov rax, qword ptr [rsp]",
                "push rax",
                "call {inner}",
                "add rsp, 8",
                "ret",
                inner = sym $inner,
            )
        }
    };
    (@jump $name:ident, $inner:path, $load:literal) => {
        /// # Safety
        /// As the C function of this name.
        #[unsafe(naked)]
        #[cfg_attr(not(test), no_mangle)]
        pub unsafe extern "C" fn $name() {
            core::arch::naked_asm!($load, "jmp {inner}", inner = sym $inner)
        }
    };
}
pub(crate) use with_caller;
