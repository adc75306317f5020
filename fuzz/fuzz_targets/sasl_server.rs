//! Fuzzes the SASL server of mirror listeners (client input before and
//! after authentication): the input is a sequence of request frames (a
//! 2-byte length, then the frame without its size prefix), fed to one
//! exchange as a client would send them (SaslHandshake, SaslAuthenticate
//! rounds, anything else). No input may panic; an exchange that says
//! `Authenticated` must have been given a right password (the fuzzer does
//! not know it), and every answer is a whole frame answering the request.
#![no_main]

use std::sync::{Arc, OnceLock};

use libfuzzer_sys::fuzz_target;
use mirrorguard::codec::RequestHeader;
use mirrorguard::sasl::server::{credential_line, CredentialStore, ServerAuth, Step};
use mirrorguard::sasl::Mechanism;

fn server() -> Arc<ServerAuth> {
    static SERVER: OnceLock<Arc<ServerAuth>> = OnceLock::new();
    SERVER
        .get_or_init(|| {
            let lines: Vec<String> = [Mechanism::ScramSha256, Mechanism::ScramSha512]
                .iter()
                .map(|m| credential_line("fetcher", *m, b"not-in-the-corpus", 4096).unwrap())
                .collect();
            let text = lines.join("\n");
            Arc::new(ServerAuth::with_store(
                vec![Mechanism::ScramSha256, Mechanism::ScramSha512, Mechanism::Plain],
                CredentialStore::parse(&text).unwrap(),
                None,
                text.as_bytes(),
            ))
        })
        .clone()
}

fuzz_target!(|data: &[u8]| {
    let server = server();
    let mut exchange = server.exchange();
    let mut rest = data;
    while rest.len() >= 2 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]])).min(rest.len() - 2);
        let body = &rest[2..2 + len];
        rest = &rest[2 + len..];
        let mut frame = (body.len() as i32).to_be_bytes().to_vec();
        frame.extend_from_slice(body);
        let Ok(h) = RequestHeader::parse(&frame) else {
            continue;
        };
        match exchange.step(&h, &frame, "fuzz") {
            Step::Answer(f) => check(&f, h.correlation_id),
            Step::Authenticated { .. } => panic!("authenticated without the password"),
            Step::Failed { frame, .. } => {
                if let Some(f) = frame {
                    check(&f, h.correlation_id);
                }
                return;
            }
        }
    }
});

fn check(f: &[u8], correlation_id: i32) {
    let size = i32::from_be_bytes([f[0], f[1], f[2], f[3]]) as usize;
    assert_eq!(size + 4, f.len());
    assert_eq!(&f[4..8], &correlation_id.to_be_bytes());
}
