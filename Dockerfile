# The mirrorguard container image (deploy/kubernetes/ runs it next to each
# destination broker). Two stages: the binary is built in the Rust image, and
# runs from a distroless base (glibc and libgcc only: no shell, no package
# manager) as the non-root user 65532, with nothing writable in the image.
#
#   docker build -t mirrorguard:0.1.0 .
#
# Its configuration, admin token and TLS files are mounted at run time
# (/etc/mirrorguard); none is in the image. Linted by hadolint and checked by
# checkov in the test suite (tests/integration/test_deploy_manifests.py).

FROM rust:1.95.0-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
COPY docs/openapi.json ./docs/openapi.json
RUN cargo build --release --locked --bin mirrorguard \
    && install -D -m 0555 target/release/mirrorguard /out/mirrorguard

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /out/mirrorguard /usr/local/bin/mirrorguard
USER 65532:65532
# The admin listener on loopback (the default of `ctl --admin`).
HEALTHCHECK --interval=10s --timeout=5s CMD ["/usr/local/bin/mirrorguard", "ctl", "health"]
ENTRYPOINT ["/usr/local/bin/mirrorguard"]
CMD ["run", "--config", "/etc/mirrorguard/proxy.toml"]
