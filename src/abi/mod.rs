//! Raw NVIDIA driver ABI: escape numbers, parameter structs, class ids, controls, UVM commands
//! and the per-branch layout table. Facts come from `docs/nvidia-abi.md`; every struct has
//! a compile-time size/offset check and every request word a golden value in the tests.
//!
//! Nothing here touches memory or the kernel: it only describes bytes.

use core::mem::size_of;

pub use gdrshim_common::nodes;

/// A GPU's UUID, as RM and UVM pass it.
pub type Uuid = [u8; 16];

pub type NvHandle = u32;

// ---------------------------------------------------------------------------------------------
// ioctl encoding (/dev/nvidiactl, /dev/nvidiaN)

pub const NV_IOCTL_MAGIC: u32 = 0x46; // 'F'

/// `_IOWR('F', nr, size)`: the driver reads only `_IOC_NR` and `_IOC_SIZE`.
pub const fn nv_ioctl(nr: u32, size: usize) -> u64 {
    (0xC000_0000u32 | ((size as u32 & 0x3fff) << 16) | (NV_IOCTL_MAGIC << 8) | nr) as u64
}
pub const fn ioc_nr(request: u64) -> u32 {
    (request & 0xff) as u32
}
pub const fn ioc_type(request: u64) -> u32 {
    ((request >> 8) & 0xff) as u32
}
pub const fn ioc_size(request: u64) -> usize {
    ((request >> 16) & 0x3fff) as usize
}

pub mod esc {
    pub const RM_ALLOC_MEMORY: u32 = 0x27;
    pub const RM_ALLOC_OBJECT: u32 = 0x28;
    pub const RM_FREE: u32 = 0x29;
    pub const RM_CONTROL: u32 = 0x2A;
    pub const RM_ALLOC: u32 = 0x2B;
    pub const RM_DUP_OBJECT: u32 = 0x34;
    pub const RM_SHARE: u32 = 0x35;
    pub const RM_VID_HEAP_CONTROL: u32 = 0x4A;
    pub const RM_MAP_MEMORY: u32 = 0x4E;
    pub const RM_UNMAP_MEMORY: u32 = 0x4F;
    pub const RM_MAP_MEMORY_DMA: u32 = 0x57;
    pub const RM_UNMAP_MEMORY_DMA: u32 = 0x58;
    pub const CARD_INFO: u32 = 0xC8;
    pub const REGISTER_FD: u32 = 0xC9;
    pub const CHECK_VERSION_STR: u32 = 0xD2;
    pub const IOCTL_XFER_CMD: u32 = 0xD3;
    /// NV_IOCTL_BASE + 17, on a /dev/nvidiaN fd only (nvidia-abi.md S10).
    pub const EXPORT_TO_DMABUF_FD: u32 = 0xD9;
}

// ---------------------------------------------------------------------------------------------
// Class ids

pub mod class {
    pub const NV01_ROOT: u32 = 0x0;
    pub const NV01_ROOT_NON_PRIV: u32 = 0x1;
    pub const NV01_ROOT_CLIENT: u32 = 0x41;
    pub const NV01_DEVICE_0: u32 = 0x80;
    pub const NV20_SUBDEVICE_0: u32 = 0x2080;
    pub const NV01_MEMORY_SYSTEM: u32 = 0x3E;
    pub const NV01_MEMORY_LOCAL_PRIVILEGED: u32 = 0x3F;
    pub const NV01_MEMORY_LOCAL_USER: u32 = 0x40;
    pub const NV01_MEMORY_VIRTUAL: u32 = 0x70;
    /// Host memory the caller already has (NV_ESC_RM_ALLOC_MEMORY's pMemory), described to RM:
    /// libcuda's pinned host memory (its own, cudaHostAlloc's, cudaHostRegister's).
    pub const NV01_MEMORY_SYSTEM_OS_DESCRIPTOR: u32 = 0x71;
    pub const NV01_MEMORY_LOCAL_PHYSICAL: u32 = 0xC2;
    pub const NV_MEMORY_FABRIC: u32 = 0xF8;
    pub const NV50_MEMORY_VIRTUAL: u32 = 0x50A0;
    pub const NV50_THIRD_PARTY_P2P: u32 = 0x503C;
    pub const FERMI_VASPACE_A: u32 = 0x90F1;

    pub const fn is_root(c: u32) -> bool {
        matches!(c, NV01_ROOT | NV01_ROOT_NON_PRIV | NV01_ROOT_CLIENT)
    }
    /// Classes of system memory: host pages, whatever GPU VA they are also mapped at.
    pub const fn is_sysmem(c: u32) -> bool {
        matches!(c, NV01_MEMORY_SYSTEM | NV01_MEMORY_SYSTEM_OS_DESCRIPTOR)
    }
    /// Classes whose alloc parameters are NV_MEMORY_ALLOCATION_PARAMS.
    pub const fn uses_memory_alloc_params(c: u32) -> bool {
        matches!(c, NV01_MEMORY_LOCAL_USER | NV01_MEMORY_SYSTEM | NV50_MEMORY_VIRTUAL)
    }
}

// ---------------------------------------------------------------------------------------------
// NV503C (third-party P2P)

pub mod p2p {
    pub const CTRL_CLASS: u32 = 0x503C;
    pub const REGISTER_VA_SPACE: u32 = 0x503C_0102;
    pub const UNREGISTER_VA_SPACE: u32 = 0x503C_0103;
    pub const REGISTER_VIDMEM: u32 = 0x503C_0104;
    pub const UNREGISTER_VIDMEM: u32 = 0x503C_0105;
    pub const REGISTER_PID: u32 = 0x503C_0106;
    pub const TYPE_BAR1: u32 = 1;
    /// RM takes offset, address and size in 64 KiB units.
    pub const GRANULE: u64 = 64 << 10;
}

pub mod status;

// ---------------------------------------------------------------------------------------------
// UVM (/dev/nvidia-uvm): the request is the plain command number.

pub mod uvm {
    pub const INITIALIZE: u64 = 0x3000_0001;
    pub const DEINITIALIZE: u64 = 0x3000_0002;
    pub const REGISTER_GPU_VASPACE: u64 = 25;
    pub const UNREGISTER_GPU_VASPACE: u64 = 26;
    pub const MAP_EXTERNAL_ALLOCATION: u64 = 33;
    pub const FREE: u64 = 34;
    pub const REGISTER_GPU: u64 = 37;
    pub const UNREGISTER_GPU: u64 = 38;
    pub const UNMAP_EXTERNAL: u64 = 66;
    pub const CREATE_EXTERNAL_RANGE: u64 = 73;
    /// Maps `[base, base+length)` of an external range sparse on one GPU, after unmapping what
    /// that GPU had mapped there (uvm_map_external_sparse_on_gpu): a release, like an unmap.
    pub const MAP_EXTERNAL_SPARSE: u64 = 74;
    pub const MM_INITIALIZE: u64 = 75;
}

// ---------------------------------------------------------------------------------------------
// Parameter structs (x86-64). Identical 535 → 595 unless the name carries a branch.

pub mod pod;
pub use pod::{pod_bytes, read_pod, zeroed, Pod};

mod structs;
pub use structs::*;
pub mod cuda;
pub mod dmabuf;
pub mod mlx5dv;
pub mod verbs;

// ---------------------------------------------------------------------------------------------
// Per-branch table

/// What differs between driver branches, as far as gdrshim reads or writes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AbiTable {
    /// First version this node describes, e.g. "580.65.06".
    pub since: &'static str,
    pub memory_alloc_params_size: usize,
    pub vaspace_alloc_params_size: usize,
    pub uvm_max_gpus: usize,
    /// UVM_FREE_PARAMS carries `length` (24 bytes) up to 580.x.
    pub uvm_free_has_length: bool,
    /// NV_ESC_EXPORT_TO_DMABUF_FD is issued with [`dmabuf::ExportToDmabufFd`] (570 and later;
    /// the older 2600-byte struct was never verified, so the DMA-BUF route is off there).
    pub dmabuf_export: bool,
    /// `paramsSize` of NV2080_CTRL_CMD_GPU_GET_INFO_V2 (its list length changes per branch), where
    /// it was read in the branch's headers.
    pub gpu_info_v2_size: Option<usize>,
    /// `paramsSize` of NV2080_CTRL_CMD_FB_GET_INFO_V2: `4 + 8 * NV2080_CTRL_FB_INFO_MAX_LIST_SIZE`
    /// (ctrl2080fb.h, per tag: 535.43.02:331 0x36, 545.29.02/550.40.07:335 0x37, 570.86.15:363 and
    /// 575.51.02:363 0x39, 580.65.06:371 and 590.44.01:372 0x80).
    pub fb_info_v2_size: Option<usize>,
}

impl AbiTable {
    pub const fn uvm_map_external(&self) -> UvmMapExternalLayout {
        UvmMapExternalLayout { max_gpus: self.uvm_max_gpus }
    }
    pub const fn uvm_free_size(&self) -> usize {
        if self.uvm_free_has_length {
            size_of::<UvmFreeParamsV535>()
        } else {
            size_of::<UvmFreeParamsV590>()
        }
    }
}

/// A driver version as `major.minor.patch`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct DriverVersion(pub u32, pub u32, pub u32);

impl DriverVersion {
    /// Parses "580.159.04" (also "580.159" and surrounding whitespace or NUL bytes).
    pub fn parse(s: &str) -> Option<DriverVersion> {
        let s = s.trim_matches(|c: char| c.is_whitespace() || c == '\0');
        let mut it = s.split('.');
        let major = it.next()?.parse().ok()?;
        let minor = it.next()?.parse().ok()?;
        let patch = match it.next() {
            Some(p) => p.parse().ok()?,
            None => 0,
        };
        if it.next().is_some() {
            return None;
        }
        Some(DriverVersion(major, minor, patch))
    }
}

impl core::fmt::Display for DriverVersion {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        write!(f, "{}.{}.{:02}", self.0, self.1, self.2)
    }
}

const V535: AbiTable = AbiTable {
    since: "535.0.0",
    memory_alloc_params_size: 120,
    vaspace_alloc_params_size: 48,
    uvm_max_gpus: 32,
    uvm_free_has_length: true,
    dmabuf_export: false,
    gpu_info_v2_size: Some(516),
    fb_info_v2_size: Some(4 + 8 * 0x36),
};
const V545: AbiTable = AbiTable {
    since: "545.23.06",
    memory_alloc_params_size: 128,
    gpu_info_v2_size: None,
    fb_info_v2_size: Some(4 + 8 * 0x37),
    ..V535
};
const V550_40: AbiTable = AbiTable { since: "550.40.07", gpu_info_v2_size: Some(524), ..V545 };
const V550_54: AbiTable = AbiTable { since: "550.54.14", uvm_max_gpus: 256, ..V550_40 };
const V555: AbiTable = AbiTable { since: "555.42.02", ..V550_54 };
const V570: AbiTable = AbiTable {
    since: "570.86.15",
    dmabuf_export: true,
    fb_info_v2_size: Some(4 + 8 * 0x39),
    ..V555
};
const V575: AbiTable = AbiTable { since: "575.51.02", gpu_info_v2_size: Some(532), ..V570 };
const V580: AbiTable = AbiTable {
    since: "580.65.06",
    vaspace_alloc_params_size: 56,
    gpu_info_v2_size: Some(564),
    fb_info_v2_size: Some(4 + 8 * 0x80),
    ..V575
};
const V590: AbiTable = AbiTable { since: "590.44.01", uvm_free_has_length: false, ..V580 };

/// Branches whose layouts were verified (fact sheet §7). Anything else is pass-through.
pub fn table_for(v: DriverVersion) -> Option<&'static AbiTable> {
    let DriverVersion(major, minor, _) = v;
    Some(match major {
        535 => &V535,
        545 => &V545,
        550 if (minor, v.2) < (54, 14) => &V550_40,
        550 => &V550_54,
        555 | 560 | 565 => &V555,
        570 => &V570,
        575 => &V575,
        580 => &V580,
        590 | 595 => &V590,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn golden_request_words() {
        assert_eq!(nv_ioctl(esc::RM_ALLOC_MEMORY, size_of::<Nvos02WithFd>()), 0xC038_4627);
        assert_eq!(nv_ioctl(esc::RM_FREE, size_of::<Nvos00Free>()), 0xC010_4629);
        assert_eq!(nv_ioctl(esc::RM_CONTROL, size_of::<Nvos54Control>()), 0xC020_462A);
        assert_eq!(nv_ioctl(esc::RM_ALLOC, size_of::<Nvos21Alloc>()), 0xC020_462B);
        assert_eq!(nv_ioctl(esc::RM_ALLOC, size_of::<Nvos64Alloc>()), 0xC030_462B);
        assert_eq!(nv_ioctl(esc::RM_DUP_OBJECT, size_of::<Nvos55Dup>()), 0xC01C_4634);
        assert_eq!(nv_ioctl(esc::RM_VID_HEAP_CONTROL, 184), 0xC0B8_464A);
        assert_eq!(nv_ioctl(esc::RM_MAP_MEMORY, size_of::<Nvos33WithFd>()), 0xC038_464E);
        assert_eq!(nv_ioctl(esc::RM_UNMAP_MEMORY, size_of::<Nvos34Unmap>()), 0xC020_464F);
        assert_eq!(nv_ioctl(esc::RM_MAP_MEMORY_DMA, size_of::<Nvos46V535>()), 0xC038_4657);
        assert_eq!(nv_ioctl(esc::RM_MAP_MEMORY_DMA, size_of::<Nvos46V580>()), 0xC040_4657);
        assert_eq!(nv_ioctl(esc::CARD_INFO, 32 * 72), 0xC900_46C8);
        assert_eq!(nv_ioctl(esc::REGISTER_FD, size_of::<RegisterFd>()), 0xC004_46C9);
        assert_eq!(nv_ioctl(esc::CHECK_VERSION_STR, size_of::<RmApiVersion>()), 0xC048_46D2);
        assert_eq!(nv_ioctl(esc::IOCTL_XFER_CMD, 16), 0xC010_46D3);
    }

    #[test]
    fn request_word_fields_round_trip() {
        let r = 0xC030_462Bu64;
        assert_eq!(ioc_nr(r), esc::RM_ALLOC);
        assert_eq!(ioc_type(r), NV_IOCTL_MAGIC);
        assert_eq!(ioc_size(r), 48);
    }

    #[test]
    fn branch_table_follows_the_fact_sheet() {
        let t = |s| table_for(DriverVersion::parse(s).unwrap()).copied();
        let v535 = t("535.288.01").unwrap();
        assert_eq!((v535.memory_alloc_params_size, v535.uvm_max_gpus), (120, 32));
        assert_eq!(v535.uvm_map_external().size(), 1200);
        assert_eq!(v535.uvm_free_size(), 24);
        assert_eq!(t("545.23.06").unwrap().memory_alloc_params_size, 128);
        assert_eq!(t("550.40.07").unwrap().gpu_info_v2_size, Some(524));
        assert_eq!(t("550.40.07").unwrap().uvm_max_gpus, 32);
        assert_eq!(t("550.54.14").unwrap().uvm_max_gpus, 256);
        assert_eq!(t("550.163.01").unwrap().uvm_map_external().size(), 9264);
        assert!(t("570.86.15").unwrap().dmabuf_export && !t("565.57.01").unwrap().dmabuf_export);
        let v580 = t("580.159.04").unwrap();
        assert_eq!((v580.vaspace_alloc_params_size, v580.uvm_free_size()), (56, 24));
        assert_eq!(v580.fb_info_v2_size, Some(1028));
        assert_eq!(t("575.64.05").unwrap().fb_info_v2_size, Some(460));
        assert_eq!(t("555.58.02").unwrap().fb_info_v2_size, Some(444));
        assert_eq!(t("535.288.01").unwrap().fb_info_v2_size, Some(436));
        let v590 = t("590.48.01").unwrap();
        assert_eq!(v590.uvm_free_size(), 16);
        assert_eq!(t("595.45.04"), Some(v590));
        assert_eq!(t("595.71.05"), Some(v590));
        // Branches nobody verified are refused, never guessed.
        assert_eq!(t("530.41.03"), None);
        assert_eq!(t("600.10.01"), None);
        assert_eq!(t("540.1.1"), None);
    }

    #[test]
    fn version_parsing() {
        assert_eq!(DriverVersion::parse("580.159.04\0\0"), Some(DriverVersion(580, 159, 4)));
        assert_eq!(DriverVersion::parse(" 595.45.04\n"), Some(DriverVersion(595, 45, 4)));
        assert_eq!(DriverVersion::parse("580.159"), Some(DriverVersion(580, 159, 0)));
        assert_eq!(DriverVersion::parse("580"), None);
        assert_eq!(DriverVersion::parse("a.b.c"), None);
        assert_eq!(DriverVersion::parse("1.2.3.4"), None);
        assert_eq!(DriverVersion(580, 159, 4).to_string(), "580.159.04");
    }

    #[test]
    fn pod_round_trip() {
        let r = Nv503cRegisterVidmem {
            h_memory: 0x5c00_0096,
            _pad0: 0,
            address: 0x7f43_5200_0000,
            size: 64 << 20,
            offset: 0,
        };
        let b = pod_bytes(&r);
        // Bytes as the H200 trace shows them for cudaMalloc(64 MiB).
        assert_eq!(hex(b), "9600005c0000000000000052437f000000000004000000000000000000000000");
        assert_eq!(read_pod::<Nv503cRegisterVidmem>(b), Some(r));
        assert_eq!(read_pod::<Nv503cRegisterVidmem>(&b[..31]), None);
    }

    fn hex(b: &[u8]) -> String {
        b.iter().map(|x| format!("{x:02x}")).collect()
    }
}
