//! Region PID mapping (SPEC 2.1): rewrites a mirrored producer id into a
//! region derived from the source cluster's id, statelessly and idempotently.
//!
//! Two layouts, both keeping the original PID in bits 30..0:
//! - `sign-bit` (the seed's): bit 63 = 1, bits 62..31 = 32-bit region;
//! - `high` (EOS-safe): bits 63..62 = 01, bits 61..31 = 31-bit region, so
//!   mapped PIDs stay positive and a stock broker still tracks them.
//!
//! Both layouts treat a PID of either layout as already mapped: every
//! negative PID other than -1 (sign-bit), and every PID with bits 63..62 =
//! 01 (high). -1 ("no producer") is never touched.

mod cli;
mod cluster_id;

pub use cli::{run_map, LayoutArg, MapArgs};
pub use cluster_id::{ClusterId, ClusterIdError};

/// Mask of the 31 original-PID bits.
pub const PID_MASK: i64 = 0x7FFF_FFFF;
/// Marker bit of the high layout (bit 62).
const HIGH_MARK: u64 = 1 << 62;
/// Marker bit of the sign-bit layout (bit 63).
const SIGN_MARK: u64 = 1 << 63;

/// Where the region goes in a mapped PID.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Layout {
    /// Bits 63..62 = 01, 31-bit region in 61..31 (EOS-safe: PIDs stay > -1).
    High,
    /// Bit 63 = 1, 32-bit region in 62..31 (the seed layout).
    SignBit,
}

impl Layout {
    /// Mask of this layout's region selector.
    pub fn region_mask(self) -> u32 {
        match self {
            Layout::High => 0x7FFF_FFFF,
            Layout::SignBit => 0xFFFF_FFFF,
        }
    }

    /// Name as used in configuration and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Layout::High => "high",
            Layout::SignBit => "sign-bit",
        }
    }
}

/// fold(uuid) = (most significant 64 bits XOR least significant 64 bits),
/// low 32 bits.
pub fn fold(id: &ClusterId) -> u32 {
    let (msb, lsb) = id.halves();
    // Truncation to the low 32 bits is the definition.
    (msb ^ lsb) as u32
}

/// The region of a layout: (fold + salt) masked to the layout's width,
/// wrapping like the 64-bit arithmetic of the spec.
pub fn region(fold: u32, salt: i64, layout: Layout) -> u32 {
    let sum = u64::from(fold).wrapping_add(salt as u64);
    (sum as u32) & layout.region_mask()
}

/// Result of [`map_pid`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapOutcome {
    /// -1: no producer, left as is.
    NoProducer,
    /// Already mapped (by either layout): passes through unchanged.
    AlreadyMapped(i64),
    /// Freshly mapped.
    Mapped(i64),
    /// The source PID was >= 2^31 and was folded into 31 bits before mapping;
    /// the caller must route it through collision handling and count it.
    Oversized {
        /// The mapped PID computed from the folded value.
        mapped: i64,
        /// The folded 31-bit value that was placed in the low bits.
        folded: i64,
    },
    /// The sign-bit mapping of this PID in this region would be -1 (region
    /// 0xFFFFFFFF, PID 2^31-1), which means "no producer": the caller must
    /// pick another salt. Never produced by the high layout.
    ReservedValue,
}

impl MapOutcome {
    /// The PID to write into the batch (`None` for [`MapOutcome::ReservedValue`]).
    pub fn pid(self, original: i64) -> Option<i64> {
        match self {
            MapOutcome::NoProducer => Some(original),
            MapOutcome::AlreadyMapped(p) | MapOutcome::Mapped(p) => Some(p),
            MapOutcome::Oversized { mapped, .. } => Some(mapped),
            MapOutcome::ReservedValue => None,
        }
    }
}

/// Whether `pid` is mapped by either layout.
pub fn is_mapped(pid: i64) -> bool {
    pid < -1 || (pid as u64) >> 62 == 0b01
}

/// Folds a PID of up to 62 bits into 31 bits (XOR of the two 31-bit halves),
/// so that different large PIDs rarely land on the same value.
pub fn fold_oversized(pid: i64) -> i64 {
    (pid ^ (pid >> 31)) & PID_MASK
}

/// Maps a source PID into the region `fold + salt` of `layout`.
pub fn map_pid(pid: i64, fold: u32, salt: i64, layout: Layout) -> MapOutcome {
    if pid == -1 {
        return MapOutcome::NoProducer;
    }
    if is_mapped(pid) {
        return MapOutcome::AlreadyMapped(pid);
    }
    // Here 0 <= pid < 2^62 (negatives other than -1 are sign-bit mapped).
    let oversized = pid > PID_MASK;
    let low = if oversized { fold_oversized(pid) } else { pid };
    let region = u64::from(region(fold, salt, layout));
    let mark = match layout {
        Layout::High => HIGH_MARK,
        Layout::SignBit => SIGN_MARK,
    };
    let mapped = (mark | (region << 31) | low as u64) as i64;
    if mapped == -1 {
        return MapOutcome::ReservedValue;
    }
    if oversized {
        MapOutcome::Oversized {
            mapped,
            folded: low,
        }
    } else {
        MapOutcome::Mapped(mapped)
    }
}

/// A mapped PID taken apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decoded {
    /// Which layout produced it.
    pub layout: Layout,
    /// The region selector.
    pub region: u32,
    /// The original (possibly folded) 31-bit PID.
    pub original: i64,
}

/// Takes a mapped PID apart; `None` if it is not mapped.
pub fn decode(pid: i64) -> Option<Decoded> {
    if !is_mapped(pid) {
        return None;
    }
    let u = pid as u64;
    let original = pid & PID_MASK;
    let (layout, region) = if pid < 0 {
        (Layout::SignBit, ((u >> 31) & 0xFFFF_FFFF) as u32)
    } else {
        (Layout::High, ((u >> 31) & 0x7FFF_FFFF) as u32)
    };
    Some(Decoded {
        layout,
        region,
        original,
    })
}
