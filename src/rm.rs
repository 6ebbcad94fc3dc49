//! The production [`Rm`]: our own RM calls, issued on the CUDA client's /dev/nvidiactl fd through
//! the real `ioctl` (never through our hook, so they are not decoded as the program's traffic).

use crate::abi::{
    self, esc, p2p, status, zeroed, Nv503cAllocParams, Nv503cRegisterVaSpace, Nv503cRegisterVidmem, Nv503cUnregisterVidmem, Nvos00Free,
    Nvos21Alloc, Nvos54Control,
};
use crate::registrar::Rm;
use crate::tracker::{Tracker, VidmemTuple};
use core::ffi::c_void;

pub struct RealRm<'a> {
    pub tracker: &'a Tracker,
}

impl RealRm<'_> {
    fn fd(&self, client: u32) -> Result<i32, u32> {
        self.tracker.client_fd(client).ok_or(status::NV_ERR_INVALID_CLIENT)
    }

    /// One RM escape on `fd`; errno is preserved for the caller of the hook that got us here.
    fn ioctl<T: abi::Pod>(&self, fd: i32, nr: u32, arg: &mut T) -> Result<(), u32> {
        let real = crate::real::ioctl().ok_or(status::NV_ERR_GENERIC)?;
        let e = crate::shim::errno();
        let req = abi::nv_ioctl(nr, core::mem::size_of::<T>());
        // SAFETY: arg is a live, correctly sized RM parameter struct for this escape.
        let rc = unsafe { real(fd, req as libc::c_ulong, arg as *mut T as *mut c_void) };
        crate::shim::set_errno(e);
        if rc != 0 {
            Err(status::NV_ERR_GENERIC)
        } else {
            Ok(())
        }
    }

    fn control<P: abi::Pod>(&self, client: u32, object: u32, cmd: u32, params: &mut P) -> Result<(), u32> {
        let fd = self.fd(client)?;
        let mut c: Nvos54Control = zeroed();
        c.h_client = client;
        c.h_object = object;
        c.cmd = cmd;
        c.params = params as *mut P as u64;
        c.params_size = core::mem::size_of::<P>() as u32;
        self.ioctl(fd, esc::RM_CONTROL, &mut c)?;
        if c.status != status::NV_OK {
            return Err(c.status);
        }
        Ok(())
    }
}

impl Rm for RealRm<'_> {
    fn alloc_p2p(&mut self, client: u32, subdevice: u32) -> Result<u32, u32> {
        let fd = self.fd(client)?;
        let mut params = Nv503cAllocParams { flags: p2p::TYPE_BAR1 };
        let mut a: Nvos21Alloc = zeroed();
        a.h_root = client;
        a.h_object_parent = subdevice;
        a.h_object_new = 0; // RM picks the handle: no clash with libcuda's own numbering
        a.h_class = abi::class::NV50_THIRD_PARTY_P2P;
        a.p_alloc_parms = &mut params as *mut Nv503cAllocParams as u64;
        a.params_size = core::mem::size_of::<Nv503cAllocParams>() as u32;
        self.ioctl(fd, esc::RM_ALLOC, &mut a)?;
        if a.status != status::NV_OK {
            return Err(a.status);
        }
        Ok(a.h_object_new)
    }

    fn register_va_space(&mut self, client: u32, p2p_obj: u32, h_vaspace: u32) -> Result<u64, u32> {
        let mut p: Nv503cRegisterVaSpace = zeroed();
        p.h_va_space = h_vaspace;
        self.control(client, p2p_obj, p2p::REGISTER_VA_SPACE, &mut p)?;
        Ok(p.va_space_token)
    }

    fn register_vidmem(&mut self, client: u32, p2p_obj: u32, t: &VidmemTuple) -> Result<(), u32> {
        let mut p = Nv503cRegisterVidmem { h_memory: t.mem.memory, _pad0: 0, address: t.address, size: t.size, offset: t.offset };
        self.control(client, p2p_obj, p2p::REGISTER_VIDMEM, &mut p)
    }

    fn unregister_vidmem(&mut self, client: u32, p2p_obj: u32, h_memory: u32) -> Result<(), u32> {
        let mut p = Nv503cUnregisterVidmem { h_memory };
        self.control(client, p2p_obj, p2p::UNREGISTER_VIDMEM, &mut p)
    }

    fn free(&mut self, client: u32, parent: u32, h: u32) -> Result<(), u32> {
        let fd = self.fd(client)?;
        let mut f = Nvos00Free { h_root: client, h_object_parent: parent, h_object_old: h, status: 0 };
        self.ioctl(fd, esc::RM_FREE, &mut f)?;
        if f.status != status::NV_OK {
            return Err(f.status);
        }
        Ok(())
    }
}
