//! Region PID mapping (SPEC 2.1): worked examples, cluster-id parsing, and
//! properties (idempotent, injective within a region, cross-layout
//! recognition, -1 untouched, oversized PIDs flagged).

use mirrorguard::pid::{decode, fold, is_mapped, map_pid, region, ClusterId, Layout, MapOutcome};
use proptest::prelude::*;

const LAYOUTS: [Layout; 2] = [Layout::High, Layout::SignBit];

fn mapped(o: MapOutcome) -> i64 {
    match o {
        MapOutcome::Mapped(p) => p,
        other => panic!("expected Mapped, got {other:?}"),
    }
}

#[test]
fn spec_examples() {
    // Sign-bit, fold 42: 1 | region 42 (32 bits) | PID 5 (31 bits).
    let want = ((1u64 << 63) | (42u64 << 31) | 5) as i64;
    assert_eq!(mapped(map_pid(5, 42, 0, Layout::SignBit)), want);
    let want99 = ((1u64 << 63) | (99u64 << 31) | 5) as i64;
    assert_eq!(mapped(map_pid(5, 99, 0, Layout::SignBit)), want99);
    // High, fold 42: 01 | region 42 (31 bits) | PID 5.
    assert_eq!(
        mapped(map_pid(5, 42, 0, Layout::High)),
        4_611_686_108_621_701_125
    );
    assert_eq!(
        mapped(map_pid(5, 42, 0, Layout::High)),
        (1i64 << 62) | (42 << 31) | 5
    );
    // Salt shifts the region.
    assert_eq!(
        mapped(map_pid(5, 42, 3, Layout::High)),
        mapped(map_pid(5, 45, 0, Layout::High))
    );
    // The high layout masks the region to 31 bits.
    assert_eq!(region(0xFFFF_FFFF, 0, Layout::High), 0x7FFF_FFFF);
    assert_eq!(region(0xFFFF_FFFF, 1, Layout::SignBit), 0);
    assert_eq!(region(5, -6, Layout::SignBit), 0xFFFF_FFFF);
}

#[test]
fn naive_negation_is_not_idempotent_but_ours_is() {
    // The seed's `-(pid + 2)`: a second hop turns -7 back into 5.
    let neg = |p: i64| -(p + 2);
    assert_eq!(neg(neg(5)), 5);
    let once = mapped(map_pid(5, 42, 0, Layout::High));
    assert_eq!(
        map_pid(once, 99, 0, Layout::High),
        MapOutcome::AlreadyMapped(once)
    );
    assert_eq!(
        map_pid(once, 99, 0, Layout::SignBit),
        MapOutcome::AlreadyMapped(once)
    );
}

#[test]
fn minus_one_and_reserved_value() {
    for l in LAYOUTS {
        assert_eq!(map_pid(-1, 7, 0, l), MapOutcome::NoProducer);
    }
    assert!(!is_mapped(-1));
    assert_eq!(decode(-1), None);
    // Sign-bit region 0xFFFFFFFF with PID 2^31-1 would be -1.
    assert_eq!(
        map_pid(0x7FFF_FFFF, 0xFFFF_FFFF, 0, Layout::SignBit),
        MapOutcome::ReservedValue
    );
    assert!(
        matches!(map_pid(0x7FFF_FFFF, 0xFFFF_FFFF, 0, Layout::High), MapOutcome::Mapped(p) if p > 0)
    );
}

#[test]
fn oversized_pids_are_flagged() {
    let big = 1i64 << 31;
    match map_pid(big, 42, 0, Layout::High) {
        MapOutcome::Oversized { mapped, folded } => {
            assert!(folded <= 0x7FFF_FFFF);
            assert_eq!(mapped & 0x7FFF_FFFF, folded);
            assert!(is_mapped(mapped));
        }
        other => panic!("expected Oversized, got {other:?}"),
    }
    assert!(matches!(
        map_pid(0x7FFF_FFFF, 42, 0, Layout::High),
        MapOutcome::Mapped(_)
    ));
}

#[test]
fn cluster_id_forms() {
    let b64 = ClusterId::parse("MkU3OEVBNTcwNTJENDM2Qg").unwrap();
    assert_eq!(&b64.0, b"2E78EA57052D436B");
    assert_eq!(b64.to_string(), "MkU3OEVBNTcwNTJENDM2Qg");
    let uuid = ClusterId::parse(&b64.to_uuid_string()).unwrap();
    assert_eq!(uuid, b64);
    let u = ClusterId::parse("3243A1C6-1D26-4A0A-8B0E-4C1C1A1B2C3D").unwrap();
    assert_eq!(u.to_uuid_string(), "3243a1c6-1d26-4a0a-8b0e-4c1c1a1b2c3d");
    // fold = low 32 bits of msb ^ lsb.
    let (m, l) = u.halves();
    assert_eq!(m, 0x3243_a1c6_1d26_4a0a);
    assert_eq!(l, 0x8b0e_4c1c_1a1b_2c3d);
    assert_eq!(fold(&u), ((m ^ l) & 0xFFFF_FFFF) as u32);
    for bad in [
        "",
        "my-cluster",
        "MkU3OEVBNTcwNTJENDM2Qh", // non-zero trailing bits
        "MkU3OEVBNTcwNTJENDM2Q",  // 21 chars
        "MkU3OEVBNTcwNTJENDM2Q+", // standard, not URL-safe, alphabet
        "MkU3OEVBNTcwNTJENDM2Qg==",
        "3243a1c6-1d26-4a0a-8b0e-4c1c1a1b2c3g",
        "3243a1c6x1d26-4a0a-8b0e-4c1c1a1b2c3d",
        "3243a1c61d264a0a8b0e4c1c1a1b2c3d",
        " MkU3OEVBNTcwNTJENDM2Qg",
    ] {
        let e = ClusterId::parse(bad).unwrap_err().to_string();
        assert!(e.contains("invalid cluster id"), "{bad}: {e}");
        assert!(
            e.contains("base64") && e.contains("UUID"),
            "message explains the accepted forms: {e}"
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    #[test]
    fn idempotent(pid in any::<i64>(), f in any::<u32>(), f2 in any::<u32>(), salt in any::<i64>(), l in 0..2usize, l2 in 0..2usize) {
        let (l, l2) = (LAYOUTS[l], LAYOUTS[l2]);
        if let Some(once) = map_pid(pid, f, salt, l).pid(pid) {
            // Mapping again, with any region and either layout, changes nothing.
            let twice = map_pid(once, f2, salt, l2).pid(once);
            prop_assert_eq!(twice, Some(once));
        }
    }

    #[test]
    fn injective_within_a_region(a in 0i64..=0x7FFF_FFFF, b in 0i64..=0x7FFF_FFFF, f in any::<u32>(), salt in any::<i64>(), l in 0..2usize) {
        let l = LAYOUTS[l];
        let (ma, mb) = (map_pid(a, f, salt, l), map_pid(b, f, salt, l));
        if let (Some(x), Some(y)) = (ma.pid(a), mb.pid(b)) {
            prop_assert_eq!(x == y, a == b);
        }
    }

    #[test]
    fn distinct_regions_never_meet(a in 0i64..=0x7FFF_FFFF, f in any::<u32>(), g in any::<u32>(), l in 0..2usize) {
        let l = LAYOUTS[l];
        prop_assume!(region(f, 0, l) != region(g, 0, l));
        prop_assert_ne!(map_pid(a, f, 0, l).pid(a), map_pid(a, g, 0, l).pid(a));
    }

    #[test]
    fn layouts_recognise_each_other(pid in 0i64..=0x7FFF_FFFF, f in any::<u32>(), salt in any::<i64>(), l in 0..2usize) {
        let l = LAYOUTS[l];
        let other = if l == Layout::High { Layout::SignBit } else { Layout::High };
        if let Some(m) = map_pid(pid, f, salt, l).pid(pid) {
            prop_assert!(is_mapped(m));
            prop_assert_eq!(map_pid(m, f, salt, other), MapOutcome::AlreadyMapped(m));
            let d = decode(m).unwrap();
            prop_assert_eq!(d.layout, l);
            prop_assert_eq!(d.region, region(f, salt, l));
            prop_assert_eq!(d.original, pid);
        }
    }

    #[test]
    fn high_layout_stays_positive(pid in 0i64..(1 << 62), f in any::<u32>(), salt in any::<i64>()) {
        let m = map_pid(pid, f, salt, Layout::High).pid(pid).unwrap();
        prop_assert!(m > 0, "stock brokers treat PID <= -1 as no producer");
        prop_assert_eq!(pid > 0x7FFF_FFFF, matches!(map_pid(pid, f, salt, Layout::High), MapOutcome::Oversized { .. }));
    }

    #[test]
    fn unmapped_pids_are_small_or_oversized(pid in any::<i64>()) {
        // Anything not mapped is a valid source PID (>= 0, < 2^62) or -1.
        if !is_mapped(pid) {
            prop_assert!(pid == -1 || (0..(1i64 << 62)).contains(&pid));
            prop_assert_eq!(decode(pid), None);
        }
    }

    #[test]
    fn cluster_id_round_trips(bytes in any::<[u8; 16]>()) {
        let id = ClusterId(bytes);
        prop_assert_eq!(ClusterId::parse(&id.to_base64()).unwrap(), id);
        prop_assert_eq!(ClusterId::parse(&id.to_uuid_string()).unwrap(), id);
    }

    #[test]
    fn cluster_id_parse_never_panics(s in ".{0,40}") {
        let _ = ClusterId::parse(&s);
    }
}
