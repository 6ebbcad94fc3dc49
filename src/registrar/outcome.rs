//! What a verbs call over one of the registrar's decisions came to, as a value: the hooks hand it
//! to the registrar right after the call, and where the registrar's lock is not had in time
//! (another thread holds it past the hooks' wait) it is kept and taken in by the next holder
//! (`pipeline/late.rs`). A lost outcome would keep a shared buffer's hold, its fd and the GPU
//! memory under it until exit, or an NV503C registration past its MR: one is lost only where the
//! queue's own lock is not had either (said in a warning) or the hooks are inert (a forked child).
#![forbid(unsafe_code)]

use super::{Decision, Export, HeldRef, Registrar, Rm};

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The provider's call over NV503C decision `d` made `mr` (0: it made none).
    Nv503c { d: Decision, mr: u64 },
    /// `ibv_reg_dmabuf_mr` (or a umem registration) of export `e` made `mr`; `provider_addr` is
    /// what the provider put in `ibv_mr.addr`, `va` the caller's address shown there instead.
    DmabufMr { e: Export, mr: u64, provider_addr: u64, va: u64 },
    /// Export `e` was made for a call that did not use it (the provider refused it).
    DmabufUnused(Export),
    /// The provider's deregistration of `mr`, whose reference `held` came out of the table
    /// before the call, returned (`deregistered`: it freed the MR).
    DeregEnd { mr: u64, held: HeldRef, deregistered: bool },
    /// `mr` no longer holds what it held (a re-registration moved it elsewhere).
    Dereg { mr: u64 },
    /// The provider's deregistration of `mr` begins, and the registrar's lock was not had in
    /// time: its reference comes out of the table when this is taken in (kept in order before the
    /// call, so before any later registration that gets the same pointer back) and waits under
    /// `ticket` for [`Outcome::DeregQueuedEnd`].
    DeregQueuedBegin { ticket: u64, mr: u64, shown_addr: u64 },
    /// That deregistration returned (`deregistered`: the provider freed the MR).
    DeregQueuedEnd { ticket: u64, mr: u64, deregistered: bool },
}

/// How a deregistration's reference was taken out: now (the registrar's lock was had), or by a
/// queued outcome (`Outcome::DeregQueuedBegin`), whose end is owed under its ticket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DeregStart {
    Taken(HeldRef),
    Queued(u64),
}

impl Registrar {
    /// Takes in what a call over one of this registrar's decisions came to.
    pub fn take_outcome(&mut self, rm: &mut dyn Rm, o: Outcome) {
        match o {
            Outcome::Nv503c { d, mr } => self.after_reg(rm, &d, mr),
            Outcome::DmabufMr { e, mr, provider_addr, va } => self.after_dmabuf_reg(rm, mr, &e, provider_addr, va),
            Outcome::DmabufUnused(e) => self.dmabuf_not_used(rm, &e),
            Outcome::DeregEnd { mr, held, deregistered } => self.finish_dereg(rm, mr, held, deregistered),
            Outcome::Dereg { mr } => self.after_dereg(rm, mr),
            Outcome::DeregQueuedBegin { ticket, mr, shown_addr } => {
                if let Some(held) = self.take_mr(rm, mr, shown_addr) {
                    self.dereg_in_flight.insert(ticket, held);
                }
            }
            Outcome::DeregQueuedEnd { ticket, mr, deregistered } => {
                if let Some(held) = self.dereg_in_flight.remove(&ticket) {
                    self.finish_dereg(rm, mr, held, deregistered);
                }
            }
        }
    }
}
