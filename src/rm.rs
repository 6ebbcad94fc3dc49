//! The production [`Rm`]: our own RM calls, issued through the real `ioctl` (never through our
//! hook, so they are not decoded as the program's traffic). Client calls go on the client's own
//! /dev/nvidiactl fd (strict client validation); dma-buf exports on a /dev/nvidiaN fd of the
//! memory's GPU that this object opens and owns (RM refuses an export on another GPU's node with
//! NV_ERR_INVALID_OBJECT_PARENT, so a wrong node can never give wrong pages).

use crate::abi::dmabuf::{
    self, CardInfo, ExportToDmabufFd, GpuIdInfoV2, StaticBar1Info, CARD_INFO_ENTRIES,
};
use crate::abi::{self, esc, p2p, status, zeroed, AbiTable};
use crate::abi::{
    Nv503cAllocParams, Nv503cRegisterVaSpace, Nv503cRegisterVidmem, Nv503cUnregisterVidmem,
    Nvos00Free, Nvos21Alloc, Nvos54Control,
};
use crate::decode::DevKind;
use crate::fd::OwnedFd;
use crate::fdtable::own;
use crate::registrar::bar1::{self, Bar1};
use crate::registrar::{Client, Rm};
use crate::tracker::VidmemTuple;
use core::ffi::c_void;

pub struct RealRm {
    table: &'static AbiTable,
    /// Where the device nodes are (`/dev`; a test folder under GDRSHIM_TEST_DEV_DIR).
    dev_dir: String,
    /// Where sysfs is (`/sys`; `sys` in the test folder).
    sys_dir: String,
    /// /dev/nvidiaN fds opened for exports: (minor, fd).
    gpu_fds: Vec<(u32, OwnedFd)>,
    /// RM device instance → minor number, as RM answered.
    minors: Vec<(u32, u32)>,
}

impl RealRm {
    pub fn new(table: &'static AbiTable, test_dev_dir: Option<&str>) -> RealRm {
        RealRm {
            table,
            dev_dir: test_dev_dir.unwrap_or("/dev").to_string(),
            sys_dir: test_dev_dir.map(|d| format!("{d}/sys")).unwrap_or_else(|| "/sys".into()),
            gpu_fds: Vec::new(),
            minors: Vec::new(),
        }
    }

    /// One escape on `fd`; errno is preserved for the caller of the hook that got us here.
    fn ioctl_bytes(fd: i32, nr: u32, arg: *mut c_void, size: usize) -> Result<(), u32> {
        let real = crate::activation::real_ioctl().ok_or(status::NV_ERR_GENERIC)?;
        let e = crate::sys::errno();
        let req = abi::nv_ioctl(nr, size);
        // SAFETY: arg points to `size` bytes of a correctly laid out parameter struct for `nr`,
        // alive and not otherwise borrowed for the call.
        let rc = unsafe { real(fd, req as libc::c_ulong, arg) };
        let err = crate::sys::errno();
        crate::sys::set_errno(e);
        if rc != 0 {
            crate::log_debug!("our ioctl nr={nr:#x} on fd {fd} failed: errno {err}");
            return Err(status::NV_ERR_GENERIC);
        }
        Ok(())
    }

    fn ioctl<T: abi::Pod>(fd: i32, nr: u32, arg: &mut T) -> Result<(), u32> {
        Self::ioctl_bytes(fd, nr, arg as *mut T as *mut c_void, core::mem::size_of::<T>())
    }

    fn control_bytes(c: Client, object: u32, cmd: u32, params: &mut [u8]) -> Result<(), u32> {
        let mut ctl: Nvos54Control = zeroed();
        ctl.h_client = c.handle;
        ctl.h_object = object;
        ctl.cmd = cmd;
        ctl.params = params.as_mut_ptr() as u64;
        ctl.params_size = params.len() as u32;
        Self::ioctl(c.ctl_fd, esc::RM_CONTROL, &mut ctl)?;
        if ctl.status != status::NV_OK {
            return Err(ctl.status);
        }
        Ok(())
    }

    fn control<P: abi::Pod>(c: Client, object: u32, cmd: u32, params: &mut P) -> Result<(), u32> {
        let mut ctl: Nvos54Control = zeroed();
        ctl.h_client = c.handle;
        ctl.h_object = object;
        ctl.cmd = cmd;
        ctl.params = params as *mut P as u64;
        ctl.params_size = core::mem::size_of::<P>() as u32;
        Self::ioctl(c.ctl_fd, esc::RM_CONTROL, &mut ctl)?;
        if ctl.status != status::NV_OK {
            return Err(ctl.status);
        }
        Ok(())
    }

    /// The minor number of the GPU with device instance `instance`: NV_ESC_CARD_INFO gives each
    /// node's gpuId, NV0000_CTRL_CMD_GPU_GET_ID_INFO_V2 each gpuId's device instance.
    fn minor_of(&mut self, c: Client, instance: u32) -> Result<u32, u32> {
        if let Some(&(_, m)) = self.minors.iter().find(|(i, _)| *i == instance) {
            return Ok(m);
        }
        let mut cards = [zeroed::<CardInfo>(); CARD_INFO_ENTRIES];
        Self::ioctl_bytes(
            c.ctl_fd,
            esc::CARD_INFO,
            cards.as_mut_ptr() as *mut c_void,
            core::mem::size_of_val(&cards),
        )?;
        for card in cards.iter().filter(|k| k.valid != 0) {
            let mut id: GpuIdInfoV2 = zeroed();
            id.gpu_id = card.gpu_id;
            if Self::control(c, c.handle, dmabuf::GPU_GET_ID_INFO_V2, &mut id).is_ok() {
                self.minors.push((id.device_instance, card.minor_number));
            }
        }
        self.minors
            .iter()
            .find(|(i, _)| *i == instance)
            .map(|&(_, m)| m)
            .ok_or(status::NV_ERR_INVALID_DEVICE)
    }

    /// Our /dev/nvidiaN fd of `minor`, opened once, checked to be still ours and that node before
    /// every use (a program may close fds it does not own, `close_range` and raw system calls
    /// too: an export must never be asked of a number that is something else now; one system
    /// call, kept on purpose). The caller holds `_making` from before this check to the end of
    /// the ioctl that uses the number: no program close runs meanwhile, so the check holds.
    fn gpu_fd(&mut self, minor: u32, _making: &own::Making) -> Result<i32, u32> {
        if let Some(i) = self.gpu_fds.iter().position(|(m, _)| *m == minor) {
            let (_, fd) = &self.gpu_fds[i];
            if own::is_ours(fd)
                && crate::fdtable::classify_fstat(fd.num()) == Some(DevKind::Gpu(minor))
            {
                return Ok(fd.num());
            }
            let (_, fd) = self.gpu_fds.swap_remove(i);
            Self::let_go(fd, "its /dev/nvidia node fd");
        }
        let path = std::ffi::CString::new(format!("{}/nvidia{minor}", self.dev_dir))
            .map_err(|_| status::NV_ERR_GENERIC)?;
        let open = crate::real::open().ok_or(status::NV_ERR_GENERIC)?;
        let e = crate::sys::errno();
        let no_cancel = crate::sys::NoCancel::new();
        // (no fork and no program close from the open to the adopt: the caller's `_making`)
        // SAFETY: a valid C string; open has no other preconditions.
        let fd = unsafe { open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC, 0) };
        drop(no_cancel);
        let err = crate::sys::errno();
        crate::sys::set_errno(e);
        if fd < 0 {
            crate::log_warn!(
                "cannot open {} for a dma-buf export: errno {err}",
                path.to_string_lossy()
            );
            return Err(status::NV_ERR_GENERIC);
        }
        let Some(fd) = own::adopt(fd) else { return Err(status::NV_ERR_GENERIC) };
        if crate::fdtable::classify_fstat(fd.num()) != Some(DevKind::Gpu(minor)) {
            own::close(fd);
            return Err(status::NV_ERR_INVALID_DEVICE);
        }
        let num = fd.num();
        self.gpu_fds.push((minor, fd));
        Ok(num)
    }

    /// An fd of ours the program closed: the number is left alone, and said (rate-limited).
    fn let_go(fd: OwnedFd, what: &str) {
        let (n, _) = fd.into_parts();
        crate::log_limited!(
            crate::config::Level::Warn,
            "own fd closed by the program",
            "fd {n}, {what}, was closed by the program (close, dup2, close_range, closefrom or a raw system call): gdrshim lets the number go and never closes or uses it again"
        );
    }

    /// RM's BAR1_SIZE of the GPU behind `subdevice` in bytes (`None`: not asked on this branch,
    /// refused, or RM could not tell: it answers 0 then).
    fn rm_bar1_bytes(&self, c: Client, subdevice: u32) -> Option<u64> {
        let size = self.table.fb_info_v2_size?;
        let mut p = vec![0u8; size];
        p[dmabuf::GPU_INFO_LIST_SIZE..][..4].copy_from_slice(&1u32.to_le_bytes());
        p[dmabuf::GPU_INFO_FIRST_INDEX..][..4]
            .copy_from_slice(&dmabuf::FB_INFO_INDEX_BAR1_SIZE.to_le_bytes());
        Self::control_bytes(c, subdevice, dmabuf::FB_GET_INFO_V2, &mut p).ok()?;
        let kib =
            u32::from_le_bytes(p[dmabuf::GPU_INFO_FIRST_DATA..][..4].try_into().expect("4 bytes"));
        (kib > 0).then_some(u64::from(kib) << 10)
    }

    /// The length of BAR 1 of the PCI device of RM device instance `instance`, from sysfs.
    fn sysfs_bar1_bytes(&mut self, c: Client, instance: u32) -> Option<u64> {
        let minor = self.minor_of(c, instance).ok()?;
        let mut cards = [zeroed::<CardInfo>(); CARD_INFO_ENTRIES];
        Self::ioctl_bytes(
            c.ctl_fd,
            esc::CARD_INFO,
            cards.as_mut_ptr() as *mut c_void,
            core::mem::size_of_val(&cards),
        )
        .ok()?;
        let k = cards.iter().find(|k| k.valid != 0 && k.minor_number == minor)?;
        let path = format!(
            "{}/bus/pci/devices/{:04x}:{:02x}:{:02x}.{:x}/resource",
            self.sys_dir, k.pci_domain, k.pci_bus, k.pci_slot, k.pci_function
        );
        bar1::sysfs_bar_len(&Self::read_small(&path)?, 1)
    }

    /// A small text file read whole, the fd ours while it is read (`files::read_small`).
    fn read_small(path: &str) -> Option<String> {
        let (bytes, whole) = crate::files::read_small(path, 4096)?;
        if !whole {
            return None;
        }
        String::from_utf8(bytes).ok()
    }

    /// One NV_ESC_EXPORT_TO_DMABUF_FD on our GPU node fd `fd`: the new buffer's fd, ours, where
    /// the call made one. `making` is held from before the checks of the numbers the call uses.
    fn export_on(
        fd: i32,
        params: &mut ExportToDmabufFd,
        making: own::Making,
    ) -> Result<Option<OwnedFd>, u32> {
        let creates = params.fd == -1;
        // no fork and no program close between the driver's making the buffer's fd and its
        // adopt (forkgate, closegate)
        Self::ioctl(fd, esc::EXPORT_TO_DMABUF_FD, params)?;
        let made = if creates && params.fd >= 0 { own::adopt(params.fd) } else { None };
        drop(making);
        if params.status != status::NV_OK {
            // RM hands out the fd only on success; never leave one behind all the same (a buffer
            // made by an earlier call of the same export is closed by the caller)
            if let Some(made) = made {
                own::close(made);
            }
            return Err(params.status);
        }
        match made {
            Some(made) => Ok(Some(made)),
            // the program closed the new number before it was ours: nothing of it is used
            None if creates => Err(status::NV_ERR_GENERIC),
            None => Ok(None),
        }
    }
}

impl Rm for RealRm {
    fn alloc_p2p(&mut self, c: Client, subdevice: u32) -> Result<u32, u32> {
        let mut params = Nv503cAllocParams { flags: p2p::TYPE_BAR1 };
        let mut a: Nvos21Alloc = zeroed();
        a.h_root = c.handle;
        a.h_object_parent = subdevice;
        a.h_object_new = 0; // RM picks the handle: no clash with libcuda's own numbering
        a.h_class = abi::class::NV50_THIRD_PARTY_P2P;
        a.p_alloc_parms = &mut params as *mut Nv503cAllocParams as u64;
        a.params_size = core::mem::size_of::<Nv503cAllocParams>() as u32;
        Self::ioctl(c.ctl_fd, esc::RM_ALLOC, &mut a)?;
        if a.status != status::NV_OK {
            return Err(a.status);
        }
        Ok(a.h_object_new)
    }

    fn register_va_space(&mut self, c: Client, p2p_obj: u32, h_vaspace: u32) -> Result<u64, u32> {
        let mut p: Nv503cRegisterVaSpace = zeroed();
        p.h_va_space = h_vaspace;
        Self::control(c, p2p_obj, p2p::REGISTER_VA_SPACE, &mut p)?;
        Ok(p.va_space_token)
    }

    fn register_vidmem(&mut self, c: Client, p2p_obj: u32, t: &VidmemTuple) -> Result<(), u32> {
        let mut p = Nv503cRegisterVidmem {
            h_memory: t.mem.memory,
            _pad0: 0,
            address: t.address,
            size: t.size,
            offset: t.offset,
        };
        Self::control(c, p2p_obj, p2p::REGISTER_VIDMEM, &mut p)
    }

    fn unregister_vidmem(&mut self, c: Client, p2p_obj: u32, h_memory: u32) -> Result<(), u32> {
        let mut p = Nv503cUnregisterVidmem { h_memory };
        Self::control(c, p2p_obj, p2p::UNREGISTER_VIDMEM, &mut p)
    }

    fn free(&mut self, c: Client, parent: u32, h: u32) -> Result<(), u32> {
        let mut f =
            Nvos00Free { h_root: c.handle, h_object_parent: parent, h_object_old: h, status: 0 };
        Self::ioctl(c.ctl_fd, esc::RM_FREE, &mut f)?;
        if f.status != status::NV_OK {
            return Err(f.status);
        }
        Ok(())
    }

    fn gpu_dmabuf_capable(&mut self, c: Client, subdevice: u32) -> Result<bool, u32> {
        let size = self.table.gpu_info_v2_size.ok_or(status::NV_ERR_INVALID_PARAM_STRUCT)?;
        let mut p = vec![0u8; size];
        p[dmabuf::GPU_INFO_LIST_SIZE..][..4].copy_from_slice(&1u32.to_le_bytes());
        p[dmabuf::GPU_INFO_FIRST_INDEX..][..4]
            .copy_from_slice(&dmabuf::GPU_INFO_INDEX_DMABUF_CAPABILITY.to_le_bytes());
        Self::control_bytes(c, subdevice, dmabuf::GPU_GET_INFO_V2, &mut p)?;
        let data =
            u32::from_le_bytes(p[dmabuf::GPU_INFO_FIRST_DATA..][..4].try_into().expect("4 bytes"));
        Ok(data == dmabuf::GPU_INFO_DMABUF_CAPABILITY_YES)
    }

    fn export_dmabuf(
        &mut self,
        c: Client,
        device_instance: u32,
        params: &mut ExportToDmabufFd,
        into: Option<&OwnedFd>,
    ) -> Result<Option<OwnedFd>, u32> {
        if !self.table.dmabuf_export {
            return Err(status::NV_ERR_NOT_SUPPORTED);
        }
        let minor = self.minor_of(c, device_instance)?;
        // The ioctl takes two numbers of ours: the node's, and a later call's buffer (RM adds the
        // pieces to whatever dma-buf that number names). Both are checked after `making`, which
        // holds every program close back until the ioctl returned and its new fd is adopted: a
        // number checked is the file the ioctl reaches.
        let making = own::making();
        let fd = self.gpu_fd(minor, &making)?;
        if let Some(into) = into {
            if params.fd != into.num() || !own::is_ours(into) {
                return Err(status::NV_ERR_GENERIC);
            }
        }
        crate::fdtable::closegate::widen_use_window();
        Self::export_on(fd, params, making)
    }

    fn close_fd(&mut self, fd: OwnedFd) {
        let (n, f) = (fd.num(), fd.file());
        if !own::close(fd) {
            Self::let_go(OwnedFd::new(n, f), "one of its dma-bufs");
        }
    }

    fn still_ours(&mut self, fd: &OwnedFd) -> bool {
        own::is_ours(fd)
    }

    fn hand_out(&mut self, fd: OwnedFd) -> i32 {
        own::hand_out(fd)
    }

    fn refused(&mut self, key: &'static str, line: String) {
        crate::log_limited!(crate::config::Level::Warn, key, "{line}");
    }

    fn bar1(&mut self, c: Client, subdevice: u32, device_instance: u32) -> Bar1 {
        let mut s: StaticBar1Info = zeroed();
        let is_static = Self::control(c, subdevice, dmabuf::FB_GET_STATIC_BAR1_INFO, &mut s)
            .ok()
            .map(|_| s.enabled != 0);
        let (bytes, source) = match self.rm_bar1_bytes(c, subdevice) {
            Some(b) => (Some(b), "RM"),
            None => match self.sysfs_bar1_bytes(c, device_instance) {
                Some(b) => (Some(b), "sysfs"),
                None => (None, "unknown"),
            },
        };
        let size = bytes.map(bar1::mib).unwrap_or_else(|| "unknown".into());
        let kind = match is_static {
            Some(true) => "static (exports take no BAR1 space of their own)",
            Some(false) => "not static (each dma-buf takes BAR1 space while it lives)",
            None => "static or not unknown (RM did not say)",
        };
        crate::log_info!("GPU (RM device {device_instance}): BAR1 {size} ({source}), {kind}");
        Bar1 { bytes, is_static, source }
    }

    fn notice(&mut self, line: String) {
        crate::log_warn!("{line}");
    }
}
