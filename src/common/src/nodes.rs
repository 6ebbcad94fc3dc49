//! Which character devices are NVIDIA's control and GPU nodes, for the core and the front (which
//! has no std): nothing but `core` here.

/// The major of /dev/nvidiactl and /dev/nvidiaN (nvidia-uvm's is dynamic: its node says which).
pub const NV_MAJOR: u32 = 195;
/// /dev/nvidiactl's minor.
pub const CTL_MINOR: u32 = 255;
/// The highest minor of a /dev/nvidiaN; those above it (up to 254) are nvidia-modeset and friends.
pub const MAX_GPU_MINOR: u32 = 247;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    Ctl,
    /// /dev/nvidiaN, by its minor.
    Gpu(u32),
}

/// The node a character device of this number is, if it is /dev/nvidiactl or a /dev/nvidiaN.
pub fn node(major: u32, minor: u32) -> Option<Node> {
    match (major, minor) {
        (NV_MAJOR, CTL_MINOR) => Some(Node::Ctl),
        (NV_MAJOR, m) if m <= MAX_GPU_MINOR => Some(Node::Gpu(m)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_and_gpu_nodes_only() {
        assert_eq!(node(195, 255), Some(Node::Ctl));
        assert_eq!(node(195, 0), Some(Node::Gpu(0)));
        assert_eq!(node(195, 247), Some(Node::Gpu(247)));
        assert_eq!(node(195, 254), None, "nvidia-modeset");
        assert_eq!(node(1, 3), None, "/dev/null");
    }
}
