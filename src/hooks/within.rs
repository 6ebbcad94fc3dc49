//! The copy of libibverbs this thread is inside, through gdrshim's own call to one of its
//! functions. rdma-core's `ibv_reg_mr` and `ibv_reg_mr_iova` are a tail jump to
//! `ibv_reg_mr_iova2@plt` (rdma-core 44's libibverbs.so.1), which the loader binds to gdrshim's
//! exported hook: that call is the outer one's, seen again with gdrshim's own return address as
//! its caller. It goes on to the same copy's function, decided nothing more: the outer call
//! decided the registration once, and only the outer call knows which copy its caller reaches.

use crate::real::scope::{self, Callers};
use core::cell::Cell;
use core::ffi::{c_void, CStr};
use core::ptr::null_mut;

thread_local! {
    /// The real function gdrshim is calling on this thread (null: none).
    static OUTER: Cell<*mut c_void> = const { Cell::new(null_mut()) };
}

/// Marks this thread as inside gdrshim's call to `real` while it lives.
pub struct Inside(*mut c_void);

impl Inside {
    pub fn enter(real: *mut c_void) -> Inside {
        Inside(OUTER.with(|o| o.replace(real)))
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        OUTER.with(|o| o.set(self.0));
    }
}

/// The real function gdrshim is calling on this thread, if it is inside one.
#[inline(always)]
pub fn outer() -> Option<*mut c_void> {
    let p = OUTER.with(Cell::get);
    (!p.is_null()).then_some(p)
}

/// Inside gdrshim's own call to a copy's function: that copy's `name` (found beside it, and
/// remembered in `beside`), to be called as it is. `None`: not inside one, or that copy has no
/// `name` (then the hook decides as for any caller).
pub fn reentered(beside: &Callers, name: &'static CStr) -> Option<*mut c_void> {
    let outer = outer()?;
    let f = scope::beside(beside, outer, name);
    (!f.is_null()).then_some(f)
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_mark_lasts_as_long_as_the_outer_call_and_nests() {
        assert_eq!(super::outer(), None);
        let a = 0x1000 as *mut core::ffi::c_void;
        let b = 0x2000 as *mut core::ffi::c_void;
        {
            let _outer = super::Inside::enter(a);
            assert_eq!(super::outer(), Some(a));
            {
                let _inner = super::Inside::enter(b);
                assert_eq!(super::outer(), Some(b));
            }
            assert_eq!(super::outer(), Some(a));
            let other = std::thread::spawn(|| super::outer().is_some()).join().unwrap();
            assert!(!other, "another thread is not inside the call");
        }
        assert_eq!(super::outer(), None);
    }
}
