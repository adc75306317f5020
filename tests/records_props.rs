//! Property tests of the record-batch engine: rewrites are CRC-valid and
//! touch only the PID and CRC bytes; the walker never panics on any soup of
//! batches, truncations and corruptions; a truncated tail is reported as such.

use mirrorguard::records::builder::{
    build_batch, build_control_batch, build_mirror_pid_reset, BatchSpec, RecordSpec,
};
use mirrorguard::records::control::first_control_record;
use mirrorguard::records::record::records;
use mirrorguard::records::{self, rewrite_all, walk, Entry};
use proptest::prelude::*;

#[derive(Debug, Clone)]
struct Rec {
    key: Option<Vec<u8>>,
    value: Option<Vec<u8>>,
    headers: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ts: i64,
}

fn rec_strategy() -> impl Strategy<Value = Rec> {
    (
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..200)),
        proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 0..8),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..8)),
            ),
            0..3,
        ),
        any::<i64>(),
    )
        .prop_map(|(key, value, headers, ts)| Rec {
            key,
            value,
            headers,
            ts,
        })
}

fn spec_strategy() -> impl Strategy<Value = BatchSpec> {
    (
        any::<i64>(),
        any::<i32>(),
        // Any attributes except a codec: records are built uncompressed.
        any::<i16>().prop_map(|a| a & !0x07),
        any::<i64>(),
        any::<i64>(),
        any::<i64>(),
        any::<i16>(),
        any::<i32>(),
    )
        .prop_map(|(bo, ple, attributes, bt, mt, pid, ep, seq)| BatchSpec {
            base_offset: bo,
            partition_leader_epoch: ple,
            attributes,
            base_timestamp: bt,
            max_timestamp: mt,
            producer_id: pid,
            producer_epoch: ep,
            base_sequence: seq,
        })
}

fn build(spec: &BatchSpec, recs: &[Rec]) -> Vec<u8> {
    type Header<'a> = (&'a [u8], Option<&'a [u8]>);
    let headers: Vec<Vec<Header<'_>>> = recs
        .iter()
        .map(|r| {
            r.headers
                .iter()
                .map(|(k, v)| (k.as_slice(), v.as_deref()))
                .collect()
        })
        .collect();
    let specs: Vec<RecordSpec<'_>> = recs
        .iter()
        .zip(&headers)
        .enumerate()
        .map(|(i, (r, h))| RecordSpec {
            timestamp_delta: r.ts,
            offset_delta: i as i32,
            key: r.key.as_deref(),
            value: r.value.as_deref(),
            headers: h,
        })
        .collect();
    build_batch(spec, &specs)
}

fn batch_strategy() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => (spec_strategy(), proptest::collection::vec(rec_strategy(), 0..5)).prop_map(|(s, r)| build(&s, &r)),
        1 => (any::<i64>(), any::<i64>(), any::<i16>(), any::<i32>())
            .prop_map(|(pid, ts, ep, ce)| mirrorguard::records::builder::build_abort_marker(pid, ep, ce, ts, 0, 0)),
        1 => ("[a-zA-Z0-9_-]{0,30}", any::<i64>()).prop_map(|(id, ts)| build_mirror_pid_reset(&id, 0, 0, ts)),
        1 => (any::<i16>(), proptest::collection::vec(any::<u8>(), 0..12))
            .prop_map(|(t, v)| build_control_batch(t, &v, -1, -1, 0, 0, 0)),
    ]
}

/// Exercises every parser on one blob; must never panic.
fn poke(buf: &mut [u8]) {
    let entries: Vec<_> = walk(buf).collect();
    for e in entries.iter().flatten() {
        {
            let slice = &buf[e.range().clone()];
            let _ = records::verify_crc(slice);
            let _ = first_control_record(slice);
            if let Entry::V2(h) = e {
                if let Ok(it) = records(h, slice) {
                    for r in it.flatten() {
                        let _ = r.headers().count();
                    }
                }
            }
        }
    }
    let _ = rewrite_all(buf, |h| Some(h.producer_id.wrapping_add(1)));
    let mut out = Vec::new();
    for opts in [
        mirrorguard::dump::DumpOptions::default(),
        mirrorguard::dump::DumpOptions {
            deep_iteration: true,
            json: false,
            mirror_state: true,
        },
        mirrorguard::dump::DumpOptions {
            deep_iteration: true,
            json: true,
            mirror_state: true,
        },
    ] {
        mirrorguard::dump::dump_bytes(
            std::path::Path::new("00000000000000000000.log"),
            buf,
            opts,
            &mut out,
        )
        .unwrap();
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn rewrite_is_crc_valid_and_touches_only_pid_and_crc(batch in batch_strategy(), new_pid in any::<i64>()) {
        let orig = batch.clone();
        let mut b = batch;
        let old_pid = i64::from_be_bytes(orig[43..51].try_into().unwrap());
        let changed = records::rewrite_producer_id(&mut b, new_pid);
        prop_assert_eq!(changed, old_pid != new_pid);
        prop_assert!(records::verify_crc(&b));
        prop_assert_eq!(&b[43..51], &new_pid.to_be_bytes()[..]);
        for (i, (x, y)) in orig.iter().zip(&b).enumerate() {
            if !(17..21).contains(&i) && !(43..51).contains(&i) {
                prop_assert_eq!(x, y, "byte {} changed", i);
            }
        }
        prop_assert_eq!(orig.len(), b.len());
        if !changed {
            prop_assert_eq!(orig, b);
        }
    }

    /// A batch that arrived corrupt (one byte changed anywhere the CRC
    /// covers, or in the stored CRC itself) leaves with exactly the same CRC
    /// error: `stored ^ computed` is unchanged by the O(1) rewrite, so it
    /// stays corrupt and no downstream check can tell the rewrite happened.
    #[test]
    fn rewrite_keeps_a_corrupt_batch_corrupt_by_the_same_error(
        batch in batch_strategy(),
        new_pid in any::<i64>(),
        at in any::<proptest::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let mut b = batch;
        let i = 17 + at.index(b.len() - 17);
        b[i] ^= flip;
        let error = |b: &[u8]| {
            records::compute_crc(b).unwrap() ^ u32::from_be_bytes(b[17..21].try_into().unwrap())
        };
        let before = error(&b);
        prop_assert_ne!(before, 0, "CRC-32C detects every single-byte error");
        let old_pid = i64::from_be_bytes(b[43..51].try_into().unwrap());
        let orig = b.clone();
        let mut verified = b.clone();
        let outcome = records::rewrite_producer_id_checked(&mut b, new_pid);
        if old_pid == new_pid {
            prop_assert_eq!(outcome, records::RewriteOutcome::Unchanged);
            prop_assert_eq!(&b, &orig);
        } else {
            prop_assert_eq!(outcome, records::RewriteOutcome::Rewritten);
            prop_assert_eq!(
                records::rewrite_producer_id_verified(&mut verified, new_pid),
                records::RewriteOutcome::RewrittenCrcWasInvalid
            );
            prop_assert_eq!(&b, &verified, "both variants write the same bytes");
        }
        prop_assert_eq!(error(&b), before, "same CRC error after the rewrite");
        prop_assert!(!records::verify_crc(&b));
    }

    /// A valid batch: the O(1) rewrite writes exactly the CRC a full
    /// recomputation gives, and the verifying variant agrees it was valid.
    #[test]
    fn constant_time_rewrite_equals_full_recompute(batch in batch_strategy(), new_pid in any::<i64>()) {
        let mut b = batch.clone();
        let mut verified = batch;
        let changed = records::rewrite_producer_id(&mut b, new_pid);
        prop_assert_eq!(
            u32::from_be_bytes(b[17..21].try_into().unwrap()),
            records::compute_crc(&b).unwrap()
        );
        let outcome = records::rewrite_producer_id_verified(&mut verified, new_pid);
        prop_assert_eq!(
            outcome,
            if changed { records::RewriteOutcome::Rewritten } else { records::RewriteOutcome::Unchanged }
        );
        prop_assert_eq!(b, verified);
    }

    /// `rewrite_all_verified` counts exactly the corrupt batches it rewrote
    /// and writes the same bytes as `rewrite_all`.
    #[test]
    fn rewrite_all_verified_counts_corrupt_batches(
        batches in proptest::collection::vec((batch_strategy(), any::<bool>(), any::<proptest::sample::Index>()), 1..6),
        salt in 1i64..,
    ) {
        let mut corrupt = 0;
        let blob: Vec<u8> = batches
            .iter()
            .flat_map(|(b, bad, at)| {
                let mut b = b.clone();
                if *bad {
                    let i = 21 + at.index(b.len() - 21);
                    b[i] ^= 0x5a;
                    corrupt += 1;
                }
                b
            })
            .collect();
        let mut fast = blob.clone();
        let mut slow = blob;
        let stats = rewrite_all(&mut fast, |h| Some(h.producer_id ^ salt)).unwrap();
        let checked = records::rewrite_all_verified(&mut slow, |h| Some(h.producer_id ^ salt)).unwrap();
        prop_assert_eq!(stats.crc_was_invalid, 0);
        prop_assert_eq!(checked.crc_was_invalid, corrupt);
        prop_assert_eq!(checked.rewritten, stats.rewritten);
        prop_assert_eq!(fast, slow);
    }

    #[test]
    fn rewrite_all_matches_per_batch_rewrite(batches in proptest::collection::vec(batch_strategy(), 1..6), salt in any::<i64>()) {
        let mut blob: Vec<u8> = batches.concat();
        let stats = rewrite_all(&mut blob, |h| Some(h.producer_id ^ salt)).unwrap();
        prop_assert_eq!(stats.batches, batches.len());
        let mut pos = 0;
        for b in &batches {
            let mut single = b.clone();
            let pid = i64::from_be_bytes(b[43..51].try_into().unwrap());
            records::rewrite_producer_id(&mut single, pid ^ salt);
            prop_assert_eq!(&blob[pos..pos + b.len()], &single[..]);
            pos += b.len();
        }
    }

    #[test]
    fn walker_covers_the_blob_and_flags_a_truncated_tail(
        batches in proptest::collection::vec(batch_strategy(), 1..6),
        cut in any::<proptest::sample::Index>(),
    ) {
        let blob: Vec<u8> = batches.concat();
        let last = batches.last().unwrap().len();
        let last_start = blob.len() - last;
        // Cut strictly inside the last batch (keep at least one byte of it).
        let keep = last_start + 1 + cut.index(last - 1);
        let cut_blob = &blob[..keep];
        let entries: Vec<_> = walk(cut_blob).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(entries.len(), batches.len());
        let mut pos = 0;
        for (e, b) in entries.iter().zip(&batches).take(batches.len() - 1) {
            prop_assert!(matches!(e, Entry::V2(_)));
            prop_assert_eq!(e.range().clone(), pos..pos + b.len());
            pos += b.len();
        }
        prop_assert_eq!(entries.last().unwrap(), &Entry::Truncated { range: last_start..keep });
        // The whole blob walks completely, every batch CRC-valid.
        let full: Vec<_> = walk(&blob).collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(full.len(), batches.len());
        for e in &full {
            prop_assert!(matches!(e, Entry::V2(_)));
            prop_assert!(records::verify_crc(&blob[e.range().clone()]));
        }
        // A truncated tail is never rewritten.
        let mut cut_copy = cut_blob.to_vec();
        let stats = rewrite_all(&mut cut_copy, |_| Some(42)).unwrap();
        prop_assert!(stats.truncated_tail);
        prop_assert_eq!(&cut_copy[last_start..], &cut_blob[last_start..]);
    }

    #[test]
    fn soups_with_corruption_never_panic(
        batches in proptest::collection::vec(batch_strategy(), 0..5),
        garbage in proptest::collection::vec(any::<u8>(), 0..100),
        flips in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 0..8),
        cut in any::<proptest::sample::Index>(),
    ) {
        let mut blob: Vec<u8> = batches.concat();
        blob.extend_from_slice(&garbage);
        if !blob.is_empty() {
            for (i, x) in &flips {
                let i = i.index(blob.len());
                blob[i] ^= x;
            }
            let keep = cut.index(blob.len() + 1);
            blob.truncate(keep);
        }
        poke(&mut blob);
    }

    #[test]
    fn pure_noise_never_panics(noise in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut noise = noise;
        poke(&mut noise);
    }

    #[test]
    fn header_fields_round_trip(spec in spec_strategy(), recs in proptest::collection::vec(rec_strategy(), 0..4)) {
        let b = build(&spec, &recs);
        let Some(Ok(Entry::V2(h))) = walk(&b).next() else { panic!("not a batch") };
        prop_assert_eq!(h.base_offset, spec.base_offset);
        prop_assert_eq!(h.partition_leader_epoch, spec.partition_leader_epoch);
        prop_assert_eq!(h.attributes, spec.attributes);
        prop_assert_eq!(h.producer_id, spec.producer_id);
        prop_assert_eq!(h.producer_epoch, spec.producer_epoch);
        prop_assert_eq!(h.base_sequence, spec.base_sequence);
        prop_assert_eq!(h.records_count as usize, recs.len());
        let decoded: Vec<_> = records(&h, &b).unwrap().collect::<Result<_, _>>().unwrap();
        prop_assert_eq!(decoded.len(), recs.len());
        for (d, r) in decoded.iter().zip(&recs) {
            prop_assert_eq!(d.key, r.key.as_deref());
            prop_assert_eq!(d.value, r.value.as_deref());
            prop_assert_eq!(d.timestamp_delta, r.ts);
            let hk: Vec<_> = d.headers().map(|(k, v)| (k.to_vec(), v.map(<[u8]>::to_vec))).collect();
            prop_assert_eq!(&hk, &r.headers);
        }
    }
}

#[test]
fn corrupt_length_magic_and_count_are_typed_errors() {
    let good = build_batch(&BatchSpec::default(), &[RecordSpec::default()]);
    // Length below the minimum.
    let mut b = good.clone();
    b[8..12].copy_from_slice(&13i32.to_be_bytes());
    assert!(matches!(
        walk(&b).next(),
        Some(Err(records::BatchError::SizeTooSmall { .. }))
    ));
    // Negative length.
    b[8..12].copy_from_slice(&(-5i32).to_be_bytes());
    assert!(matches!(
        walk(&b).next(),
        Some(Err(records::BatchError::SizeTooSmall { .. }))
    ));
    // v2 length below a v2 header.
    b[8..12].copy_from_slice(&40i32.to_be_bytes());
    assert!(matches!(
        walk(&b).next(),
        Some(Err(records::BatchError::SizeTooSmall { .. }))
    ));
    // Magic 3.
    let mut b = good.clone();
    b[16] = 3;
    assert!(matches!(
        walk(&b).next(),
        Some(Err(records::BatchError::InvalidMagic { magic: 3, .. }))
    ));
    // Negative count.
    let mut b = good.clone();
    b[57..61].copy_from_slice(&(-1i32).to_be_bytes());
    assert!(matches!(
        walk(&b).next(),
        Some(Err(records::BatchError::InvalidCount { count: -1, .. }))
    ));
    // Nothing after an error.
    let mut it = walk(&b);
    it.next();
    assert!(it.next().is_none());
}

#[test]
fn legacy_entries_pass_through() {
    // A v0 message: offset 3, size 20, crc, magic 0, attrs 0, key null, value "hi".
    let mut msg = vec![0u8; 0];
    msg.extend_from_slice(&[0, 0]); // magic 0, attributes 0
    msg.extend_from_slice(&(-1i32).to_be_bytes());
    msg.extend_from_slice(&2i32.to_be_bytes());
    msg.extend_from_slice(b"hi");
    let crc = mirrorguard::dump::crc32_ieee(&msg);
    let mut entry = Vec::new();
    entry.extend_from_slice(&3i64.to_be_bytes());
    entry.extend_from_slice(&((msg.len() + 4) as i32).to_be_bytes());
    entry.extend_from_slice(&crc.to_be_bytes());
    entry.extend_from_slice(&msg);
    let mut blob = entry.clone();
    blob.extend(build_batch(&BatchSpec::default(), &[RecordSpec::default()]));
    let entries: Vec<_> = walk(&blob).collect::<Result<_, _>>().unwrap();
    assert_eq!(entries.len(), 2);
    assert_eq!(
        entries[0],
        Entry::Legacy {
            range: 0..entry.len(),
            magic: 0
        }
    );
    assert!(matches!(entries[1], Entry::V2(_)));
    let before = blob.clone();
    let stats = rewrite_all(&mut blob, |_| None).unwrap();
    assert_eq!(stats.legacy, 1);
    assert_eq!(blob, before);
    assert_eq!(mirrorguard::dump::crc32_ieee(b"123456789"), 0xCBF4_3926);
}
