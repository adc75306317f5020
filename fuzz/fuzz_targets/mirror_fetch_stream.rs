//! Fuzzes the streamed mirror fetch path (`mirror::stream`, the walker that
//! rewrites a region-mode Fetch response as it arrives) against the
//! store-and-forward one on arbitrary response bodies, delivered in pieces
//! whose sizes the input chooses: neither may panic or hang, and the stream
//! must fail wherever the held path fails (it may fail more: a response it
//! cannot finish once bytes left closes the connection). Equal bytes are the
//! proptests' job (`streamed_equals_store_and_forward`): on arbitrary input
//! the two differ by design where the held path looks ahead.
#![no_main]

use libfuzzer_sys::fuzz_target;
use mirrorguard::mirror::stream_check::{frame, held_as, mirror, streamed_as};

fuzz_target!(|input: &[u8]| {
    let Some((&selector, rest)) = input.split_first() else {
        return;
    };
    let version = [4i16, 7, 11, 12, 13, 15][usize::from(selector) % 6];
    let (cuts, body) = rest.split_at(usize::from(selector >> 4).min(rest.len()));
    let cuts: Vec<usize> = cuts.iter().map(|c| usize::from(*c) + 1).collect();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // Two identical mirrors; a reader's fetches (a fetcher's would replay
        // partitions from a source that is not there).
        let (held_mirror, _) = mirror(false);
        let (stream_mirror, _) = mirror(false);
        let held = held_as(&held_mirror, version, body, false).await;
        let streamed =
            streamed_as(&stream_mirror, version, frame(version, body), cuts, false).await;
        if let Err(e) = &held {
            assert!(streamed.is_err(), "held failed ({e}) but the stream passed");
        }
        if let (Ok(a), Ok(b)) = (&held, &streamed) {
            // Lengths never change on either path.
            assert_eq!(a.len(), body.len());
            assert_eq!(b.len(), frame(version, body).len());
        }
    });
});
