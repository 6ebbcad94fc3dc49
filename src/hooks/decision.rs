//! What the registration hooks (verbs, libmlx5's devx umems) do with the registrar's decision:
//! refuse, owe the registrar the outcome, and hand the provider gdrshim's export only while its
//! fd is still that buffer.

use crate::registrar::{Decision, Export};
use crate::shim;
use crate::sys::set_errno;
use core::ffi::c_void;

/// Whether the registration must fail without reaching the provider (`Decision::Refuse`): then
/// errno is EFAULT, as a GeForce without gdrshim answers a registration of GPU memory.
pub(crate) fn refused(d: &Option<Decision>) -> bool {
    let r = matches!(d, Some(Decision::Refuse(_)));
    if r {
        set_errno(libc::EFAULT);
    }
    r
}

/// Cancellation held off across a provider's call whose outcome the registrar is owed: an
/// NV503C registration made for it (an export's call holds it off in `register_export`). A
/// thread cancelled inside the call would never tell it, and the registration would stay until
/// exit. A pending cancellation acts at the program's next cancellation point, after the hook
/// returns.
pub(crate) fn outcome_owed(d: &Option<Decision>) -> Option<crate::sys::NoCancel> {
    matches!(d, Some(Decision::Hit { .. })).then(crate::sys::NoCancel::new)
}

/// After the provider's call: an NV503C hit's reference kept with the MR `mr`, or dropped.
pub(crate) fn after(d: Option<Decision>, mr: *mut c_void) {
    // Only an NV503C hit holds a reference that the MR must keep or drop.
    let Some(d @ Decision::Hit { .. }) = d else { return };
    shim::call_in(|s| s.verbs_after(&d, mr as u64));
}

/// What became of the registration of one of gdrshim's exports.
pub(crate) enum ExportUse<T> {
    Made(T),
    /// The provider refused (logged): the original call follows.
    Refused,
    /// The buffer's number was not gdrshim's any more when the call was to use it (the program
    /// closed it after the decision): nothing was handed to the provider, and the export's hold
    /// is given back. Decided again.
    Stale,
}

/// `before` (the registrar's decision), and while it decides on gdrshim's export, `register` of
/// it: an export whose number the program took back before the call used it is decided again (a
/// new export), three times at most. `Ok`: what `register` made; `Err`: the decision the caller goes on with (the
/// original call follows, as after a refusal).
pub(crate) fn before_export<T>(
    mut before: impl FnMut() -> Option<Decision>,
    mut register: impl FnMut(&Export) -> ExportUse<T>,
) -> Result<T, Option<Decision>> {
    for _ in 0..3 {
        let d = before();
        let Some(Decision::Exported(e)) = &d else { return Err(d) };
        match register(e) {
            ExportUse::Made(made) => return Ok(made),
            ExportUse::Refused => return Err(d),
            ExportUse::Stale => {}
        }
    }
    // taken back each time: the original call, which fails as without gdrshim
    Err(None)
}

/// The protected section of a call that hands the provider the kept fd of export `e`: the
/// number is checked to be still that buffer, and no program close or dup over it runs until
/// the value is dropped (`fdtable::own::using`). `None`: it is not ours any more; the export's
/// hold is given back ([`ExportUse::Stale`]). Nothing in the section may wait for the loader's
/// lock (a close that waits for the section may hold it).
pub(crate) fn use_export(e: &Export) -> Option<crate::fdtable::own::Using> {
    let in_use = match e.file {
        Some(file) => crate::fdtable::own::using(&[(e.fd, file)]),
        None => crate::fdtable::own::using(&[]),
    };
    match &in_use {
        Some(_) => crate::fdtable::closegate::widen_use_window(),
        None => {
            shim::call_in(|s| s.dmabuf_not_wanted(e));
        }
    }
    in_use
}
